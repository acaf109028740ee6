"""The shared-memory bulk path for weights, with a real learner service and clients over loopback
gRPC and real files in /dev/shm: bit-exact versions, one copy of egress per version however many
same-host actors read it, a tampered / truncated / missing shared file falling back to the stream,
files removed with their versions and at stop, files of dead learners swept and never trusted."""

from __future__ import annotations

import errno
import itertools
import os
import subprocess
import sys

import grpc
import ml_dtypes
import numpy as np
import pytest
from wire_helpers import connected_client, running_service, wait_until

from actors.weights.staging import WeightTransferError, stage_weights
from learner.weights.shared_memory import STALE_NAME, SharedWeightFiles, remove_stale_files
from tandem_wire import WIRE_VERSION, pb, rpc
from tandem_wire.limits import MAX_LABEL_CHARS
from tandem_wire.weights.digest import hexdigest
from tandem_wire.weights.shared_memory import SHARED_PREFIX, SHM_DIR
from tandem_wire.weights.transports import SHARED_MEMORY


def _weights(seed: int) -> list[tuple[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [("model.embed_tokens.weight", rng.standard_normal((256, 96)).astype(np.float32)),
            ("model.norm.weight", rng.standard_normal(96).astype(ml_dtypes.bfloat16))]


def _bit_equal(expected, staged) -> bool:
    if [n for n, _ in expected] != [n for n, _ in staged.tensors]:
        return False
    return all(a.dtype == b.dtype and a.tobytes() == b.tobytes()
               for (_, a), (_, b) in zip(expected, staged.tensors, strict=True))


def _fetches(**counts: int) -> dict[str, int]:
    """A client's weight_fetches with these counts and 0 elsewhere."""
    return {"shared": 0, "streamed": 0, "relayed": 0, "shared_failed": 0, "relay_failed": 0, **counts}


def _own_files() -> set[str]:
    return {p.name for p in SHM_DIR.glob(f"{SHARED_PREFIX}{os.getpid()}-*")}


def _held(service, version: int):
    """The service's packed `version` (acquired and released at once: no reader left behind)."""
    return service._desk.held(version)


def _shared_path(service, version: int) -> str:
    return pb.WeightMessage.FromString(_held(service, version).extra["shared"][1]).shared.path


def test_same_host_actors_read_one_shared_copy_and_egress_stays_one_version():
    before = _own_files()
    with running_service(weight_chunk_bytes=4096) as (service, address):
        service.publish_weights(1, _weights(1))
        total = _held(service, 1).header.total_bytes
        counts = service.accounting()
        assert counts["weight_bytes_shared"] == total and counts["weight_bytes_streamed"] == 0
        clients = [connected_client(address, f"actor-{i}") for i in range(4)]
        for client in clients:
            staged = client.fetch_weights()
            assert _bit_equal(_weights(1), staged)
            assert client.weight_fetches == _fetches(shared=1)
            staged.tensors[0][1][:] = 0  # the mapping is copy-on-write: the next actor still reads version 1
        counts = service.accounting()
        control = counts["weight_bytes_streamed"]  # header, path and commit messages only
        assert counts["weight_bytes_shared"] == total and control < 4 * 1024 < total
        assert (counts["weight_bytes_shared"] + control) / total <= 1.5  # issue 16's bound, with 4 actors
        streaming = connected_client(address, "remote", shared_memory=False)  # as an actor on another host
        assert _bit_equal(_weights(1), streaming.fetch_weights())
        assert streaming.weight_fetches["streamed"] == 1
        assert service.accounting()["weight_bytes_streamed"] - control > total  # the whole blob, framed
        first = _shared_path(service, 1)
        service.publish_weights(2, _weights(2))
        assert not os.path.exists(first)  # superseded, nobody reading: removed with its version
        assert _bit_equal(_weights(2), clients[0].fetch_weights())
        for client in (*clients, streaming):
            client.close()
    assert _own_files() == before  # stop removed the newest version's file too


@pytest.mark.parametrize("damage, reason", [
    (lambda path: _flip_byte(path), "xxh3_128 mismatch"),
    (lambda path: os.truncate(path, 100), "not a file of"),
    (lambda path: os.unlink(path), "gone"),  # asked twice (it may have been superseded), then streamed
])
def test_a_damaged_shared_file_is_never_trusted_and_the_stream_is_used_instead(damage, reason, caplog):
    with running_service(weight_chunk_bytes=4096) as (service, address):
        service.publish_weights(1, _weights(1))
        damage(_shared_path(service, 1))
        client = connected_client(address)
        assert _bit_equal(_weights(1), client.fetch_weights())
        assert client.weight_fetches == _fetches(streamed=1, shared_failed=1 + (reason == "gone"))
        assert reason in caplog.text
        client.close()


def test_a_version_superseded_before_its_file_is_opened_is_fetched_again_from_shared_memory(monkeypatch):
    """The learner's stream of a shared version is 3 small messages: it ends, and unpins the version,
    before the actor opens the file; a publish in between removes the file. The actor asks again and
    reads the newer version's file instead of streaming the whole version (CI saw one such fallback
    push the egress of a 10-step run past one version)."""
    import actors.weights.fetcher as fetcher_module

    with running_service(weight_chunk_bytes=4096) as (service, address):
        service.publish_weights(1, _weights(1))
        calls: list[int] = []

        def superseded_first(messages, version, allow_shared=False, watcher=None):
            calls.append(version)
            if len(calls) > 1:
                return stage_weights(messages, version, allow_shared, watcher)
            stream = iter(messages)
            head = list(itertools.islice(stream, 2))  # header, shared path of v1
            service.publish_weights(2, _weights(2))
            # the learner's stream ends, v1 loses its last reader and its file goes
            wait_until(lambda: not os.path.exists(head[1].shared.path), what="v1's file removed")
            return stage_weights(itertools.chain(head, stream), version, allow_shared, watcher)

        monkeypatch.setattr(fetcher_module, "stage_weights", superseded_first)
        client = connected_client(address)
        streamed_before = service.accounting()["weight_bytes_streamed"]
        staged = client.fetch_weights()
        assert staged.version == 2 and _bit_equal(_weights(2), staged)
        assert client.weight_fetches == _fetches(shared=1, shared_failed=1)
        control = service.accounting()["weight_bytes_streamed"] - streamed_before
        assert control < 4 * 1024 < _held(service, 2).header.total_bytes  # headers, paths, commits only
        client.close()


def _flip_byte(path: str) -> None:
    os.chmod(path, 0o600)  # the learner made it read-only; a hostile process of the same user need not care
    with open(path, "r+b") as f:
        f.seek(1000)
        byte = f.read(1)
        f.seek(1000)
        f.write(bytes([byte[0] ^ 0x40]))


def test_staging_refuses_shared_files_it_did_not_ask_for_or_outside_shared_memory(tmp_path):
    with running_service() as (service, _):
        service.publish_weights(1, _weights(1))
        messages = [pb.WeightMessage.FromString(m) for m in _held(service, 1).extra["shared"]]
        with pytest.raises(WeightTransferError, match="unexpected shared"):
            stage_weights(messages)  # an actor that did not offer its domain
        messages[1].shared.path = str(tmp_path / f"{SHARED_PREFIX}x")
        with pytest.raises(WeightTransferError, match="outside"):
            stage_weights(messages, allow_shared=True)
        messages[1].shared.path = "/dev/shm/../etc/passwd"
        with pytest.raises(WeightTransferError, match="outside"):
            stage_weights(messages, allow_shared=True)


def test_a_full_shared_memory_leaves_the_version_streamed_only(monkeypatch):
    def no_space(self, version, blob):
        raise OSError(errno.ENOSPC, "No space left on device")  # e.g. a container's 64 MB /dev/shm

    monkeypatch.setattr(SharedWeightFiles, "write", no_space)
    with running_service() as (service, address):
        service.publish_weights(1, _weights(1))
        assert "shared" not in _held(service, 1).extra and service.accounting()["weight_bytes_shared"] == 0
        client = connected_client(address)
        assert _bit_equal(_weights(1), client.fetch_weights())
        assert client.weight_fetches == _fetches(streamed=1)
        client.close()


def test_without_shared_memory_or_from_another_domain_the_stream_is_used():
    with running_service(weight_shared_memory=False) as (service, address):
        service.publish_weights(1, _weights(1))
        client = connected_client(address)
        assert _bit_equal(_weights(1), client.fetch_weights())
        assert client.weight_fetches["streamed"] == 1 and service.accounting()["weight_bytes_shared"] == 0
        client.close()
    with running_service() as (service, address):
        service.publish_weights(1, _weights(1))
        client = connected_client(address)
        client._weights._halves[SHARED_MEMORY].domain = "another-boot:1:2"  # an actor on another host (or container)
        assert _bit_equal(_weights(1), client.fetch_weights())
        assert client.weight_fetches == _fetches(streamed=1)
        client.close()


def test_files_of_dead_learners_are_swept_and_live_ones_kept():
    dead_pid = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                              text=True, check=True).stdout.strip()
    dead = SHM_DIR / f"{SHARED_PREFIX}{dead_pid}-00ff-v7"
    live = SHM_DIR / f"{SHARED_PREFIX}{os.getpid()}-00ff-v7"
    for path in (dead, live):
        path.write_bytes(b"stale")
    try:
        assert STALE_NAME.fullmatch(dead.name)
        assert dead in remove_stale_files(SHM_DIR) and not dead.exists() and live.exists()
    finally:
        live.unlink(missing_ok=True)
        dead.unlink(missing_ok=True)


def test_an_oversized_shared_memory_domain_is_refused():
    with running_service() as (service, address):
        service.publish_weights(1, _weights(1))
        with grpc.insecure_channel(address) as channel:
            request = pb.FetchWeightsRequest(wire_version=WIRE_VERSION, actor_id="reader",
                                             shared_memory_domain="x" * (MAX_LABEL_CHARS + 1))
            with pytest.raises(grpc.RpcError) as error:
                list(rpc.LearnerStub(channel).FetchWeights(request, timeout=10))
        assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "shared_memory_domain" in error.value.details()
        assert service.accounting()["requests_invalid"] == 1


@pytest.mark.parametrize("kind", ["xxh3_128", "blake3"])
def test_a_shared_file_is_verified_with_the_digest_its_message_names(kind):
    """The learner names the shared file's own digest (xxh3_128 by default, server.shared_weight_digest);
    the actor verifies the file with it and reports the commit's digest of the same bytes."""
    with running_service(shared_weight_digest=kind) as (service, address):
        weights = _weights(1)
        weights[0][1][3, 5] = np.nan  # found by the scan that runs beside the digest
        service.publish_weights(1, weights)
        held = _held(service, 1)
        shared = pb.WeightMessage.FromString(held.extra["shared"][1]).shared
        with open(shared.path, "rb") as f:
            assert (shared.checksum_algorithm, shared.checksum) == (kind, hexdigest(kind, f.read()))
        client = connected_client(address)
        staged = client.fetch_weights()
        assert client.weight_fetches == _fetches(shared=1) and _bit_equal(weights, staged)
        assert staged.checksum == held.checksum and held.header.checksum_algorithm == "blake3"
        assert staged.nonfinite == ("model.embed_tokens.weight",)
        client.close()


def test_a_shared_file_naming_an_unknown_digest_is_refused():
    with running_service() as (service, _):
        service.publish_weights(1, _weights(1))
        messages = [pb.WeightMessage.FromString(m) for m in _held(service, 1).extra["shared"]]
        messages[1].shared.checksum_algorithm = "crc32"
        with pytest.raises(WeightTransferError, match="shared weights: unsupported checksum algorithm 'crc32'"):
            stage_weights(messages, allow_shared=True)

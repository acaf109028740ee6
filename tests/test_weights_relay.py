"""The weight relay for actors off the learner's host, with a real learner service, real clients and
real relay servers over loopback gRPC (the learner shares no memory here, as with actors on other
hosts): one version of egress per publish however many actors fetch it, bit-exact versions, and a
relay that corrupts, dies or stalls costing only a fallback to the learner's stream."""

from __future__ import annotations

import threading

import grpc
import numpy as np
import pytest
from wire_helpers import connected_client, running_service

from actors.weights.relay import RelayedBlob, WeightRelayServer
from learner.weights.relay import RelayTree
from tandem_wire import WIRE_VERSION, pb, rpc
from tandem_wire.auth import AUTH_METADATA_KEY, bearer

CHUNK = 64 * 1024


def _tensors(seed: int) -> list[tuple[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [("model.embed_tokens.weight", rng.standard_normal((512, 256)).astype(np.float32)),
            ("model.norm.weight", rng.standard_normal(256).astype(np.float32))]


def _bit_equal(expected, staged) -> bool:
    return [n for n, _ in expected] == [n for n, _ in staged.tensors] and all(
        a.tobytes() == b.tobytes() for (_, a), (_, b) in zip(expected, staged.tensors, strict=True))


def _fetch_all(clients) -> list:
    """Every client fetches the newest version at once (threads); the staged versions in order."""
    staged: list = [None] * len(clients)
    errors: list[BaseException] = []

    def fetch(i: int) -> None:
        try:
            staged[i] = clients[i].fetch_weights()
        except BaseException as error:  # surfaced below
            errors.append(error)

    threads = [threading.Thread(target=fetch, args=(i,)) for i in range(len(clients))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors, errors
    return staged


class _Actors:
    """Clients with relay servers of their own, closed at exit."""

    def __init__(self, address: str, relays: list[WeightRelayServer]) -> None:
        self.relays = relays
        self.clients = [connected_client(address, f"actor-{i}", shared_memory=False, relay=relay)
                        for i, relay in enumerate(relays)]

    def __enter__(self) -> _Actors:
        return self

    def __exit__(self, *exc) -> None:
        for client in self.clients:
            client.close()
        for relay in self.relays:
            relay.stop(0)


def _relays(n: int, **kwargs) -> list[WeightRelayServer]:
    return [WeightRelayServer(None, chunk_bytes=CHUNK, **kwargs) for _ in range(n)]


@pytest.mark.parametrize("actors", [1, 2, 4])
def test_actors_off_the_learner_host_relay_each_version_and_the_learner_sends_it_once(actors):
    with running_service(weight_shared_memory=False, weight_chunk_bytes=CHUNK) as (service, address), \
            _Actors(address, _relays(actors)) as fleet:
        for version in (1, 2):
            before = service.accounting()
            service.publish_weights(version, _tensors(version))
            staged = _fetch_all(fleet.clients)
            assert all(_bit_equal(_tensors(version), s) and s.version == version for s in staged)
            total = staged[0].total_bytes
            counts = service.accounting()
            egress = counts["weight_bytes_streamed"] - before["weight_bytes_streamed"]
            assert total < egress <= 1.5 * total, (egress, total)  # issue 16's bound; the blob once, framed
            assert counts["weight_fetches_relayed"] - before["weight_fetches_relayed"] == actors - 1
        fetches = [c.weight_fetches for c in fleet.clients]
        assert sum(f["streamed"] for f in fetches) == 2 and sum(f["relayed"] for f in fetches) == 2 * (actors - 1)
        assert not any(f["relay_failed"] or f["shared"] for f in fetches)
        served = [r.streams_served for r in fleet.relays]
        assert sum(served) == 2 * (actors - 1) and max(served) <= 2 * 2  # fanout 2, two versions
        assert sum(r.bytes_served for r in fleet.relays) >= 2 * (actors - 1) * total


class _CorruptingRelay(WeightRelayServer):
    """A relay that forwards a copy of the blob with one byte flipped."""

    def staging(self) -> RelayedBlob:
        blob = super().staging()
        landed = blob.landed

        def corrupt(header, buffer, end):
            copy = np.array(buffer)
            copy[0] ^= 0xFF
            landed(header, copy, end)

        blob.landed = corrupt
        return blob


class _StallingRelay(WeightRelayServer):
    """A relay that forwards the first half of the blob and then nothing."""

    def staging(self) -> RelayedBlob:
        blob = super().staging()
        landed = blob.landed
        blob.landed = lambda header, buffer, end: landed(header, buffer, min(end, header.total_bytes // 2))
        return blob


@pytest.mark.parametrize("fault", ["corrupt", "dead", "stalled"])
def test_a_relay_that_corrupts_dies_or_stalls_costs_a_fallback_to_the_learner_and_is_sent_no_one_else(fault):
    bad = {"corrupt": _CorruptingRelay, "dead": WeightRelayServer, "stalled": _StallingRelay}[fault](
        None, chunk_bytes=CHUNK)
    relays = [bad, *_relays(2, stall_timeout_s=1.0)]
    with running_service(weight_shared_memory=False, weight_chunk_bytes=CHUNK) as (service, address), \
            _Actors(address, relays) as fleet:
        service.publish_weights(1, _tensors(1))
        first, second, third = fleet.clients
        assert _bit_equal(_tensors(1), first.fetch_weights())  # from the learner; it relays from now on
        if fault == "dead":
            bad.stop(0)
        staged = second.fetch_weights()  # sent to the bad relay, then to the learner
        assert _bit_equal(_tensors(1), staged)
        assert second.weight_fetches == {"shared": 0, "streamed": 1, "relayed": 0, "shared_failed": 0,
                                         "relay_failed": 1}
        assert _bit_equal(_tensors(1), third.fetch_weights())  # sent to the second actor, not the bad one
        assert third.weight_fetches["relayed"] == 1 and third.weight_fetches["relay_failed"] == 0
        assert relays[1].streams_served == 1
        # the relay's failure never reaches what was applied, and the books show one relayed fetch of two
        assert service.accounting()["weight_fetches_relayed"] == 2


def test_the_relay_server_needs_the_token_the_version_and_a_decodable_request_and_bounds_its_callers():
    relay = WeightRelayServer("s3cret", chunk_bytes=CHUNK, max_streams=1, stall_timeout_s=0.5)
    blob = relay.staging()
    header = pb.WeightHeader(version=3, total_bytes=4 * CHUNK)
    buffer = np.arange(4 * CHUNK, dtype=np.uint8)
    blob.landed(header, buffer, CHUNK)  # one chunk in, the rest still on its way
    channel = grpc.insecure_channel(relay.address)
    stub = rpc.WeightRelayStub(channel)
    token = ((AUTH_METADATA_KEY, bearer("s3cret")),)
    try:
        def call(version=3, metadata=token, wire_version=WIRE_VERSION):
            return stub.RelayWeights(pb.RelayRequest(wire_version=wire_version, version=version), metadata=metadata,
                                     timeout=10)

        for kwargs, code in (({"metadata": ()}, grpc.StatusCode.UNAUTHENTICATED),
                             ({"metadata": ((AUTH_METADATA_KEY, bearer("guess")),)}, grpc.StatusCode.UNAUTHENTICATED),
                             ({"version": 2}, grpc.StatusCode.NOT_FOUND),
                             ({"wire_version": 0}, grpc.StatusCode.INVALID_ARGUMENT)):
            with pytest.raises(grpc.RpcError) as error:
                list(call(**kwargs))
            assert error.value.code() == code, kwargs
        undecodable = channel.unary_stream("/tandem.v1.WeightRelay/RelayWeights")
        with pytest.raises(grpc.RpcError) as error:
            list(undecodable(b"\xff\xff\xff", metadata=token, timeout=10))
        assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT

        reading = call()
        first = next(reading)  # the one landed chunk; the call now waits for more and holds the one slot
        assert first.chunk.offset == 0 and first.chunk.data == buffer[:CHUNK].tobytes()
        with pytest.raises(grpc.RpcError) as error:
            list(call())
        assert error.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        blob.landed(header, buffer, 4 * CHUNK)
        blob.finished(True)
        rest = list(reading)
        assert b"".join(m.chunk.data for m in (first, *rest)) == buffer.tobytes()
        assert [m.chunk.offset for m in rest] == [CHUNK, 2 * CHUNK, 3 * CHUNK]

        stalled = relay.staging()
        stalled.landed(pb.WeightHeader(version=4, total_bytes=2 * CHUNK), buffer, CHUNK)
        with pytest.raises(grpc.RpcError) as error:
            list(call(version=4))  # half landed, then nothing for stall_timeout_s
        assert error.value.code() == grpc.StatusCode.UNAVAILABLE and "no bytes landed" in error.value.details()
    finally:
        channel.close()
        relay.stop(0)


def test_a_malformed_relay_address_is_refused():
    with running_service(weight_shared_memory=False) as (service, address):
        service.publish_weights(1, _tensors(1))
        client = connected_client(address, "a", shared_memory=False)
        try:
            for bad in ("nohost", "host:port", "h:70000", "a b:1", "x" * 300 + ":1"):
                request = pb.FetchWeightsRequest(wire_version=WIRE_VERSION, actor_id="a", relay_address=bad)
                with pytest.raises(grpc.RpcError) as error:
                    list(client._stub.FetchWeights(request, metadata=client._metadata(client._current_credential())))
                assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT, bad
        finally:
            client.close()


def test_the_relay_tree_fills_breadth_first_evicts_a_failed_relay_and_serves_repeats_and_old_versions_itself():
    tree = RelayTree(fanout=2)
    source = {}
    for name in "abcdefg":
        peer = tree.source(5, name, f"{name}:1", accept_peer=True)
        source[name] = peer and peer.actor_id
    assert source == {"a": None, "b": "a", "c": "a", "d": "b", "e": "b", "f": "c", "g": "c"}
    assert tree.source(5, "b", "b:1", accept_peer=True) is None  # a repeat: it relays to d and e already
    assert tree.source(4, "z", "z:1", accept_peer=True) is None  # an older version: the learner's
    assert tree.source(5, "d", "d:1", accept_peer=False) is None  # b failed d: b is sent nobody else
    assert tree.source(5, "h", "", accept_peer=True).actor_id == "d"  # no relay of its own; b is gone
    assert tree.source(6, "h", "", accept_peer=True) is None  # a new version starts a new tree
    assert tree.source(6, "a", "a:1", accept_peer=True) is None
    assert tree.source(6, "b", "b:1", accept_peer=True).actor_id == "a"

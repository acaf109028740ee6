"""A real learner server and real actor clients over loopback gRPC: group streaming with
exactly-once acks, multi-chunk weight transfer (bit-exact, corrupted and truncated streams
rejected), backpressure, heartbeats, status, auth token and TLS."""

from __future__ import annotations

import datetime
import ipaddress
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import grpc
import ml_dtypes
import numpy as np
import pytest
from config_helpers import service_config
from wire_helpers import (
    CAPABILITIES,
    VOCAB,
    RawActor,
    connected_client,
    make_group,
    make_prompts,
    running_service,
    wait_until,
)

from actors.learner_client import LearnerClient, LeaseReply, WeightTransferError
from learner.service.accounting import balance_violations
from learner.service.prompt_source import PromptSource
from learner.service.server import LearnerService
from tandem_wire import WIRE_VERSION, grpc_options, pb, rpc


def _consume_all(service: LearnerService, total: int, batch: int, consumed: list[str]) -> None:
    """What the RL loop does: take a batch, consume it, count the step (the lease budget grows)."""
    step = 0
    while len(consumed) < total:
        records = service.next_batch(batch, timeout=10)
        assert records, "trainer starved"
        service.mark_consumed([r.group_id for r in records])
        consumed.extend(r.group_id for r in records)
        step += 1
        service.set_step(step)


def test_stream_of_groups_is_queued_then_consumed_exactly_once():
    total = 240
    with running_service(PromptSource(make_prompts(total)), queue_capacity=32) as (service, address):
        client = connected_client(address)
        consumed: list[str] = []
        trainer = threading.Thread(target=_consume_all, args=(service, total, 16, consumed))
        trainer.start()
        sent = 0
        while True:
            reply = client.lease_prompts(8)
            if not reply.prompts and not reply.retry_after_s:
                break  # every prompt is leased
            time.sleep(reply.retry_after_s)  # the lease budget: until the trainer's next step
            for lease in reply.prompts:
                client.send_group(make_group(lease, client.actor_id, seed=sent))
                sent += 1
        assert client.drain(timeout=30), client.counts()
        trainer.join(timeout=30)
        assert sent == total and sorted(consumed) == sorted(f"0:{i}" for i in range(total))
        assert client.lease_prompts(8) == LeaseReply([], True, 0.0)
        counts = client.counts()
        assert counts["queued"] == counts["consumed"] == counts["sent"] == total and counts["unacked"] == 0
        accounting = service.accounting()
        assert balance_violations(accounting) == []
        assert accounting["groups_consumed"] == total and accounting["completions_unscorable"] == total
        status = client.status()  # the Status RPC carries the same, balancing, counts
        wire = {f.name: v for f, v in status.accounting.ListFields()}
        assert balance_violations({**dict.fromkeys(accounting, 0), **wire}) == []
        assert status.queue_capacity == 32 and status.actors[0].actor_id == client.actor_id
        client.close()


def test_consumed_groups_carry_everything_the_trainer_needs():
    with running_service(PromptSource(make_prompts(4))) as (service, address):
        client = connected_client(address)
        (lease,) = client.lease_prompts(1).prompts
        sent = make_group(lease, client.actor_id, seed=3)
        client.send_group(sent)
        (record,) = service.next_batch(1, timeout=10)
        assert record.group_id == lease.group_id and record.actor_id == client.actor_id
        assert record.prompt_ids == lease.prompt_ids and record.metadata == lease.metadata
        for c, got in zip(sent.completions, record.completions, strict=True):
            assert got.token_ids == list(c.token_ids) and got.logprobs == list(c.logprobs)
            assert got.finish_reason == "stop" and got.text == c.text
        assert record.completions[0].reward is None and record.completions[0].unscorable_reason
        assert [c.reward for c in record.completions[1:]] == [1.0, 0.0, 1.0]
        service.mark_consumed([record.group_id])
        assert client.drain(10)
        with pytest.raises(ValueError, match="not handed out"):
            service.mark_consumed([record.group_id])
        client.close()


def _weights(seed: int) -> list[tuple[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [
        ("model.embed_tokens.weight", rng.standard_normal((64, 48)).astype(np.float32)),
        ("model.layers.0.mlp.up_proj.weight", rng.standard_normal((96, 48)).astype(ml_dtypes.bfloat16)),
        ("model.norm.weight", np.full(48, np.nan, dtype=np.float32)),
    ]  # NaN payload must survive bit for bit


def _assert_bit_equal(expected, staged):
    assert [n for n, _ in expected] == [n for n, _ in staged.tensors]
    for (_, a), (_, b) in zip(expected, staged.tensors, strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def test_multi_chunk_weight_versions_arrive_bit_exact_and_versions_are_announced():
    with running_service(weight_chunk_bytes=4096) as (service, address):
        client = connected_client(address)
        with pytest.raises(WeightTransferError, match="NOT_FOUND"):
            client.fetch_weights()
        first = _weights(1)
        service.publish_weights(1, first)
        assert client.heartbeat(weight_version=0) == 1
        staged = client.fetch_weights()
        assert staged.version == 1 and staged.total_bytes > 3 * 4096
        _assert_bit_equal(first, staged)
        service.publish_weights(2, _weights(2))
        _assert_bit_equal(_weights(2), client.fetch_weights(2))
        with pytest.raises(WeightTransferError, match="not held"):
            client.fetch_weights(1)  # superseded and not being read: dropped
        with pytest.raises(ValueError, match="newer"):
            service.publish_weights(2, _weights(3))
        client.report_weights(2, applied=True, stall_s=0.1, transfer_s=staged.transfer_s)
        (actor,) = service.actors_status()
        assert actor.weight_version == 2 and actor.last_weight_report["applied"]
        client.close()


class TamperingLearner(rpc.LearnerServicer):
    """A proxy servicer in front of a real LearnerService that damages weight streams."""

    def __init__(self, service: LearnerService, damage) -> None:
        self.service, self.damage = service, damage

    def Register(self, request, context):
        return self.service.Register(request, context)

    def FetchWeights(self, request, context):
        messages = [pb.WeightMessage.FromString(m) for m in self.service.FetchWeights(request, context)]
        yield from self.damage(messages)


def _flip_a_byte(messages):
    chunk = messages[2].chunk
    data = bytearray(chunk.data)
    data[len(data) // 2] ^= 0x40
    chunk.data = bytes(data)
    return messages


def _die_after_three(messages):
    yield from messages[:3]
    raise RuntimeError("learner process died")  # the server ends the call with an error status


@pytest.mark.parametrize(
    "damage, error",
    [
        (_flip_a_byte, "blake3 mismatch"),
        (_die_after_three, "weight stream failed: UNKNOWN"),
        (lambda m: m[:-1], "truncated"),  # stream ends before the commit
        (lambda m: m[:3], "truncated"),  # stream ends mid-blob
        (lambda m: m[:2] + m[3:], "offset"),  # a chunk is missing
    ],
)
def test_corrupted_or_truncated_weight_streams_are_rejected(damage, error):
    with running_service(weight_chunk_bytes=4096) as (service, _):
        service.publish_weights(1, _weights(1))
        proxy = grpc.server(ThreadPoolExecutor(4), options=grpc_options())
        rpc.add_LearnerServicer_to_server(TamperingLearner(service, damage), proxy)
        port = proxy.add_insecure_port("127.0.0.1:0")
        proxy.start()
        try:
            client = LearnerClient(f"127.0.0.1:{port}", "actor-0", shared_memory=False)  # the chunk stream
            with pytest.raises(WeightTransferError, match=error):
                client.fetch_weights()
            client.close()
        finally:
            proxy.stop(0)


def test_backpressure_stops_an_actor_at_the_queue_bound():
    # the lease budget ((1 + 0 + 1) x 20) lets the actor lease all 40: the queue's capacity bounds what is held
    with running_service(PromptSource(make_prompts(40)), queue_capacity=6, prompts_per_step=20) as (service,
                                                                                                    address):
        client = connected_client(address)
        leases = client.lease_prompts(40).prompts
        sent = 0
        with pytest.raises(TimeoutError):
            for lease in leases:
                client.send_group(make_group(lease, client.actor_id), timeout=1.0)
                sent += 1
        # send_group returns once a group went out (a probe may be answered RETRY later), so the
        # actor holds at most the queue bound plus a couple of groups.
        assert sent in (6, 7) and service.queue_depth() == 6
        retries = service.accounting()["groups_retry"]
        time.sleep(1.0)  # credit probes go on; the queue does not grow
        assert service.queue_depth() == 6 and client.unacked_count() == sent + 1
        assert service.accounting()["groups_retry"] > retries >= 1
        consumed: list[str] = []
        trainer = threading.Thread(target=_consume_all, args=(service, 40, 4, consumed))
        trainer.start()
        for lease in leases[sent + 1 :]:
            client.send_group(make_group(lease, client.actor_id), timeout=10)
            assert service.queue_depth() <= 6
        trainer.join(timeout=30)
        assert client.drain(10) and sorted(consumed) == sorted(lease.group_id for lease in leases)
        counts = service.accounting()
        assert counts["groups_consumed"] == 40 and balance_violations(counts) == []
        client.close()


def test_heartbeats_track_actors_and_report_silent_ones_stale():
    with running_service(actor_timeout_s=0.3, heartbeat_interval_s=0.1) as (service, address):
        a, b = connected_client(address, "a"), connected_client(address, "b")
        info = a.register(CAPABILITIES, weight_version=-1)
        assert info.heartbeat_interval_s == pytest.approx(0.1) and info.max_staleness == 1
        for _ in range(5):
            a.heartbeat(weight_version=0, groups_in_flight=3, tokens_per_second=120.0,
                        time_shares={"busy": 0.75, "lease_wait": 0.125})
            time.sleep(0.1)
        views = {v.actor_id: v for v in service.actors_status()}
        assert not views["a"].stale and views["b"].stale
        assert views["a"].groups_in_flight == 3 and views["a"].tokens_per_second == 120.0
        assert (views["a"].time_shares.busy, views["a"].time_shares.lease_wait) == (0.75, 0.125)
        assert views["b"].time_shares.busy == 0  # never reported
        assert views["a"].capabilities.model_family == "qwen2"
        a.close()
        b.close()


def test_a_restarted_learner_that_forgot_the_actor_gets_it_registered_again():
    with running_service() as (_, address):
        client = LearnerClient(address, "late")
        with pytest.raises(grpc.RpcError) as error:
            client.lease_prompts(1)  # never registered: no credential, nothing to re-register with
        assert error.value.code() == grpc.StatusCode.UNAUTHENTICATED
        client.register(CAPABILITIES, 0)
    for call in (lambda c: c.heartbeat(0), lambda c: c.lease_prompts(2)):
        with running_service(address=address) as (fresh, _):  # a new learner on the same port
            call(client)
            assert [v.actor_id for v in fresh.actors_status()] == ["late"]
    client.close()


def test_a_client_retargeted_to_a_learner_on_a_new_address_resends_its_unacked_groups():
    """A restarted learner bound another port: retarget() moves the stream, registration and unacked
    groups there; the old learner never sees them again."""
    prompts = make_prompts(8)
    with running_service(PromptSource(prompts)) as (old, old_address):
        client = connected_client(old_address, "mover")
        leases = client.lease_prompts(3).prompts
        for lease in leases:
            client.send_group(make_group(lease, client.actor_id))
        wait_until(lambda: old.queue_depth() == 3, what="three groups queued at the old learner")
        state = old.state_dict()  # what a checkpoint holds
    restored = LearnerService(PromptSource(prompts), service_config(group_size=4, vocab_size=VOCAB))
    restored.load_state_dict(state)
    with running_service(service=restored) as (new, new_address):
        assert new_address != old_address
        client.retarget(new_address)
        assert client.address == new_address
        wait_until(lambda: new.queue_depth() == 3, what="the unacked groups re-sent to the new learner")
        assert [v.actor_id for v in new.actors_status()] == ["mover"]
        batch = new.next_batch(3, timeout=5)
        new.mark_consumed([r.group_id for r in batch])
        assert sorted(r.group_id for r in batch) == sorted(lease.group_id for lease in leases)
        assert client.drain(10) and client.counts()["resent"] == 3
        more = client.lease_prompts(2).prompts  # unary calls go to the new learner too
        assert len(more) == 2
    client.close()


def test_groups_leased_after_the_checkpoint_come_back_to_a_restored_learner_as_stale_not_invalid():
    """A learner restored from a checkpoint older than some leases has not issued those prompts yet:
    their groups (sampled with the crashed run's weights) are stale, and the prompts are issued again."""
    prompts = make_prompts(8)
    with running_service(PromptSource(prompts)) as (old, old_address):
        client = connected_client(old_address, "survivor")
        client.lease_prompts(2)
        checkpoint = old.state_dict()
        after = client.lease_prompts(2).prompts  # leased after the checkpoint
        client.close()
    restored = LearnerService(PromptSource(prompts), service_config(group_size=4, vocab_size=VOCAB))
    restored.load_state_dict(checkpoint)
    with running_service(service=restored) as (new, address):
        new.publish_weights(1_000_000, _weights(0))  # a restored learner's fresh version
        client = connected_client(address, "survivor")
        client.send_group(make_group(after[0], client.actor_id, policy_version=0))
        # the current version, yet a prompt this learner never issued: no honest actor sends that
        fresh = make_group(after[1], client.actor_id, policy_version=1_000_000)
        client.send_group(fresh)
        assert client.drain(10)
        rejections = {group_id: (status, detail) for group_id, status, detail in client.rejections}
        assert rejections[after[0].group_id][0] == "stale", rejections
        assert "restarted" in rejections[after[0].group_id][1]
        assert new.stale_report()["causes"] == {"before_restore": 1}  # the summary says why
        assert rejections[after[1].group_id] == ("invalid", "group_id was never leased by this learner")
        reissued = [lease.group_id for lease in client.lease_prompts(8).prompts]
        assert after[0].group_id in reissued and after[1].group_id in reissued
        client.close()


def _assert_serves_groups_and_weights(service: LearnerService, client: LearnerClient) -> None:
    """A group goes from `client` to the trainer, and version 1 (published) comes back intact."""
    client.register(CAPABILITIES, 0)
    (lease,) = client.lease_prompts(1).prompts
    client.send_group(make_group(lease, client.actor_id))
    assert service.next_batch(1, timeout=10)[0].group_id == lease.group_id
    _assert_bit_equal(_weights(1), client.fetch_weights())
    client.close()


def test_auth_token_is_required_on_every_rpc():
    with running_service(auth_token="s3cret") as (service, address):
        service.publish_weights(1, _weights(1))
        for token in (None, "wrong"):
            client = LearnerClient(address, "intruder", auth_token=token, call_timeout_s=5)
            for call in (
                lambda c: c.register(CAPABILITIES, 0),
                lambda c: c.heartbeat(0),
                lambda c: c.lease_prompts(1),
                lambda c: c.status(),
            ):
                with pytest.raises(grpc.RpcError) as error:
                    call(client)
                assert error.value.code() == grpc.StatusCode.UNAUTHENTICATED
            with pytest.raises(WeightTransferError, match="UNAUTHENTICATED"):
                client.fetch_weights()
            client.close()
        channel = grpc.insecure_channel(address)  # the bidi stream too
        acks = rpc.LearnerStub(channel).StreamGroups(iter([pb.ScoredGroup(wire_version=WIRE_VERSION)]))
        with pytest.raises(grpc.RpcError) as error:
            list(acks)
        assert error.value.code() == grpc.StatusCode.UNAUTHENTICATED
        channel.close()
        assert service.accounting()["groups_received"] == 0
        _assert_serves_groups_and_weights(service, LearnerClient(address, "friend", auth_token="s3cret"))


def _self_signed_certificate(tmp_path):
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "tandem-learner")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return str(cert_path), str(key_path)


def test_tls_when_certificates_are_configured(tmp_path):
    cert, key = _self_signed_certificate(tmp_path)
    with running_service(tls_cert_path=cert, tls_key_path=key, auth_token="t") as (service, address):
        service.publish_weights(1, _weights(1))
        _assert_serves_groups_and_weights(
            service, LearnerClient(address, "tls-actor", auth_token="t", tls_ca_path=cert)
        )
        plaintext = LearnerClient(address, "plain", auth_token="t", call_timeout_s=2)
        with pytest.raises(ConnectionError):
            plaintext.register(CAPABILITIES, 0)
        plaintext.close()


def test_the_actor_table_is_bounded_and_silent_actors_make_room():
    with running_service(max_actors=2, actor_timeout_s=0.3) as (service, address):
        a, b, c = (LearnerClient(address, name) for name in "abc")
        a.register(CAPABILITIES, 0)
        b.register(CAPABILITIES, 0)
        refused = RawActor(address, "c")  # a LearnerClient would try again until a and b fall silent
        with pytest.raises(grpc.RpcError) as error:
            refused.register()
        refused.close()
        assert error.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        time.sleep(0.2)
        b.heartbeat(0)
        time.sleep(0.2)  # a is silent past actor_timeout_s, b is not
        c.register(CAPABILITIES, 0)
        assert [v.actor_id for v in service.actors_status()] == ["b", "c"]
        for client in (a, b, c):
            client.close()


def test_fetching_from_a_learner_that_is_down_fails_fast():
    with running_service() as (service, address):
        service.publish_weights(1, _weights(1))
        client = connected_client(address)
    start = time.monotonic()
    with pytest.raises(WeightTransferError, match="UNAVAILABLE"):
        client.fetch_weights()
    assert time.monotonic() - start < 10
    client.close()


def test_waiting_for_a_groups_final_ack_ends_when_it_comes():
    """A prompt re-issued to the actor whose copy the learner just dropped may come back before that
    drop's ack: the actor waits for the ack instead of skipping the lease (which then sat unsampled
    until it expired, 60 s in which the learner held its steps for it)."""
    with running_service(PromptSource(make_prompts(4))) as (service, address):
        client = connected_client(address)
        (lease,) = client.lease_prompts(1).prompts
        assert client.wait_for_final_ack(lease.group_id, 0.01)  # never sent: nothing to wait for
        client.send_group(make_group(lease, client.actor_id))
        wait_until(lambda: service.queue_depth() == 1, what="the group queued")
        assert not client.wait_for_final_ack(lease.group_id, 0.2)  # queued: QUEUED is not final
        [record] = service.next_batch(1, timeout=5)
        threading.Timer(0.2, service.mark_consumed, args=([record.group_id],)).start()
        started = time.monotonic()
        assert client.wait_for_final_ack(lease.group_id, 10) and time.monotonic() - started < 5
        client.close()

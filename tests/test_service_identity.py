"""Per-actor identity over real gRPC on loopback: every call that changes state needs the caller's own
credential; a new registration of an actor id revokes the old credential and its leases; a client
renews its credential without losing its leases, and a superseded client stops instead of fighting."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import grpc
import numpy as np
import pytest
from wire_helpers import (
    RawActor,
    assert_honest_actor_served,
    connected_client,
    make_group,
    make_prompts,
    raw_actor,
    running_service,
)

from learner.service.accounting import balance_violations
from learner.service.prompt_source import PromptSource
from tandem_wire import WIRE_VERSION, pb


def _calls(actor: RawActor, actor_id: str) -> dict:
    """Each state-changing unary call, in `actor_id`'s name, taking call metadata."""
    return {
        "Heartbeat": lambda md: actor.stub.Heartbeat(
            pb.HeartbeatRequest(wire_version=WIRE_VERSION, actor_id=actor_id), metadata=md, timeout=10),
        "LeasePrompts": lambda md: actor.stub.LeasePrompts(
            pb.LeasePromptsRequest(wire_version=WIRE_VERSION, actor_id=actor_id, max_prompts=1), metadata=md,
            timeout=10),
        "ReportWeights": lambda md: actor.stub.ReportWeights(
            pb.WeightReport(actor_id=actor_id, version=1, applied=True), metadata=md, timeout=10),
        "StreamGroups": lambda md: list(actor.stub.StreamGroups(iter([]), metadata=md, timeout=10)),
    }


def _code(call, metadata) -> grpc.StatusCode:
    try:
        call(metadata)
    except grpc.RpcError as error:
        return error.code()
    return grpc.StatusCode.OK


def test_every_state_changing_call_needs_the_callers_own_credential():
    with running_service() as (service, address):
        service.publish_weights(1, [("w", np.zeros(4, np.float32))])
        a, b = raw_actor(address, "a"), raw_actor(address, "b")
        registration_id = a.credential.partition(".")[0]
        forged = f"{registration_id}.{'0' * 64}"
        for name, call in _calls(a, "a").items():
            assert _code(call, ()) == grpc.StatusCode.UNAUTHENTICATED, name  # no credential
            assert _code(call, a.metadata(forged)) == grpc.StatusCode.UNAUTHENTICATED, name
            assert _code(call, a.metadata()) == grpc.StatusCode.OK, name
        for name, call in _calls(b, "a").items():
            if name != "StreamGroups":  # a stream takes its actor from the credential
                assert _code(call, b.metadata()) == grpc.StatusCode.PERMISSION_DENIED, name  # b acting as a
        counts = service.accounting()
        assert counts["credentials_refused"] == 4 + 4 + 3
        reads = RawActor(address, "reader")  # reads need no credential
        assert reads.stub.Status(pb.StatusRequest(), timeout=10).weight_version == 1
        messages = list(reads.stub.FetchWeights(
            pb.FetchWeightsRequest(wire_version=WIRE_VERSION, actor_id="reader"), timeout=10))
        assert len(messages) == 3  # header, one chunk, commit
        for actor in (a, b, reads):
            actor.close()
        assert_honest_actor_served(service, address)


def _one_group_after(event: threading.Event, group: pb.ScoredGroup) -> Iterator[pb.ScoredGroup]:
    event.wait(30)
    yield group


def test_a_new_registration_revokes_the_old_credential_its_open_stream_and_its_leases():
    with running_service(PromptSource(make_prompts(4)), lease_seconds=0.5) as (service, address):
        old = raw_actor(address, "a")
        (lease,), _ = old.lease(1)
        go = threading.Event()
        stream = old.stub.StreamGroups(_one_group_after(go, make_group(lease, "a")), metadata=old.metadata())
        time.sleep(0.2)  # the stream is open, authenticated by the old credential
        new = raw_actor(address, "a")  # a restarted process (or an impostor), without the credential
        assert new.credential != old.credential
        assert _code(_calls(old, "a")["Heartbeat"], old.metadata()) == grpc.StatusCode.PERMISSION_DENIED
        with pytest.raises(grpc.RpcError) as error:
            old.register(credential=old.credential)  # the replaced client cannot take the id back
        assert error.value.code() == grpc.StatusCode.PERMISSION_DENIED
        go.set()
        with pytest.raises(grpc.RpcError) as error:
            list(stream)  # its next group ends the old registration's stream
        assert error.value.code() == grpc.StatusCode.PERMISSION_DENIED
        (ack,) = new.exchange([make_group(lease, "a")])  # the old incarnation's lease is not the new one's
        assert (ack.status, ack.detail) == (
            pb.ACK_STATUS_INVALID, f"prompt {lease.group_id} is leased to another actor")
        time.sleep(0.6)  # the old lease expires; the prompt is issued again, to the new incarnation
        assert [p.group_id for p in new.lease(1)[0]] == [lease.group_id]
        (ack,) = new.exchange([make_group(lease, "a")])
        assert ack.status == pb.ACK_STATUS_QUEUED
        counts = service.accounting()
        assert (counts["actors_superseded"], counts["lease_violations"], counts["groups_received"]) == (1, 1, 2)
        assert counts["credentials_refused"] == 3 and balance_violations(counts) == []
        old.close()
        new.close()
        assert_honest_actor_served(service, address)


def test_the_client_renews_its_credential_and_keeps_its_leases():
    with running_service() as (service, address):
        client = connected_client(address, "a")
        (lease,) = client.lease_prompts(1).prompts
        client.register({"engine": "test", "model_family": "qwen2", "max_model_len": 128, "group_size": 4,
                         "host": "localhost"}, 0)  # e.g. run() called again: a renewal
        client.send_group(make_group(lease, "a"))
        (record,) = service.next_batch(1, timeout=10)
        assert record.group_id == lease.group_id
        service.mark_consumed([record.group_id])
        assert client.drain(10) and client.counts()["consumed"] == 1
        counts = service.accounting()
        assert counts["actors_superseded"] == 0 and counts["lease_violations"] == 0
        client.close()


def test_a_call_whose_renewed_credential_is_revoked_at_once_by_another_renewal_still_goes_through():
    """After a learner restart, the group stream re-registers while a lease renews: the credential the
    lease's retry read can be revoked before it lands. The call renews and tries again."""
    with running_service() as (service, address):
        client = connected_client(address, "a")
        capabilities = {"engine": "test", "model_family": "qwen2", "max_model_len": 128, "group_size": 4,
                        "host": "localhost"}
        call, calls = client._call, []

        def racing_call(method, request, timeout, credential):
            calls.append(method)
            if method == "LeasePrompts" and calls.count(method) <= 2:
                with client._register_lock:  # another thread renews between our read and our call
                    client._register(capabilities, 0, timeout=None)
            return call(method, request, timeout, credential)

        client._call = racing_call
        (lease,) = client.lease_prompts(1).prompts
        assert calls.count("LeasePrompts") == 3 and lease.group_id
        assert service.accounting()["actors_superseded"] == 0
        client.close()


def test_a_superseded_client_stops_instead_of_taking_its_id_back():
    with running_service() as (service, address):
        client = connected_client(address, "a")
        leases = client.lease_prompts(2).prompts
        client.send_group(make_group(leases[0], "a"))
        assert service.next_batch(1, timeout=10)[0].group_id == leases[0].group_id
        impostor = raw_actor(address, "a")
        with pytest.raises(grpc.RpcError) as error:
            client.heartbeat(0)
        assert error.value.code() == grpc.StatusCode.PERMISSION_DENIED
        client.send_group(make_group(leases[1], "a"))  # its stream is refused, and the client closes
        assert not client.drain(10)
        with pytest.raises(RuntimeError, match="superseded"):
            client.send_group(make_group(leases[1], "a", seed=1))
        (ack,) = impostor.exchange([make_group(leases[1], "a")])
        assert ack.status == pb.ACK_STATUS_INVALID  # the taken-over id does not bring the leases along
        counts = service.accounting()
        assert counts["actors_superseded"] == 1 and balance_violations(counts) == []  # no fight back
        client.close()
        impostor.close()
        assert_honest_actor_served(service, address)

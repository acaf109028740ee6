"""Identity by enrollment (issue 29), over real gRPC on loopback: `Register` needs the token the run's
fleet minted for the id (tandem_wire/enrollment.py), so a holder of the run token cannot invent ids;
a flood of invented ids leaves an enrolled actor streaming; a restarted learner with the run's key
takes the same tokens back; a retired id is refused; a malformed token is UNAUTHENTICATED."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator

import grpc
import pytest
from wire_helpers import (
    CAPABILITIES,
    RawActor,
    assert_honest_actor_served,
    connected_client,
    make_group,
    raw_http2_call,
    running_service,
)

from learner.service.actor_registry import MalformedCredential
from learner.service.enrollment import EnrollmentGate, NotEnrolled
from tandem_wire import WIRE_VERSION, enrollment, pb
from tandem_wire.limits import ENROLLMENT_METADATA_KEY, MAX_METADATA_BYTES

KEY = b"k" * enrollment.KEY_BYTES
CLOSED = {"enrollment_key": KEY, "open_enrollment": False}
UNAUTHENTICATED = str(grpc.StatusCode.UNAUTHENTICATED.value[0]).encode()
SYBILS = 160


def enrolled(address: str, actor_id: str) -> RawActor:
    """A raw actor holding the token the fleet would have minted for `actor_id` under KEY."""
    return RawActor(address, actor_id, enrollment=enrollment.token(KEY, actor_id))


def _code(call) -> grpc.StatusCode:
    try:
        call()
    except grpc.RpcError as error:
        return error.code()
    return grpc.StatusCode.OK


# ---------------------------------------------------------------------- the token and the gate


def test_a_token_names_one_actor_under_one_key_and_verify_never_raises():
    token = enrollment.token(KEY, "actor-0")
    assert enrollment.well_formed(token) and len(token) == enrollment.TOKEN_CHARS
    assert token == enrollment.token(KEY, "actor-0")
    assert enrollment.verify(KEY, "actor-0", token)
    assert not enrollment.verify(KEY, "actor-1", token)
    assert not enrollment.verify(enrollment.new_key(), "actor-0", token)
    assert enrollment.new_key() != enrollment.new_key() and len(enrollment.new_key()) == enrollment.KEY_BYTES
    for presented in (None, 7, b"0" * 64, "", token.upper(), token[:-1], token + "0", "é" * 64, "\udcff" * 64,
                      "\x00" * 64, "g" * 64, "0" * 100_000):
        assert not enrollment.well_formed(presented), presented
        assert not enrollment.verify(KEY, "actor-0", presented), presented


def test_the_gate_admits_enrolled_ids_refuses_others_and_retired_ones_even_when_open():
    closed, open_ = EnrollmentGate(KEY, open_enrollment=False), EnrollmentGate(None, open_enrollment=True)
    closed.admit("a", enrollment.token(KEY, "a"))
    open_.admit("a", None)
    for presented in (None, "", enrollment.token(KEY, "b")):
        with pytest.raises(NotEnrolled):
            closed.admit("a", presented)
    for gate in (closed, open_):
        with pytest.raises(MalformedCredential) as refused:
            gate.admit("a", "é" * enrollment.TOKEN_CHARS)
        assert (refused.value.actor_id, refused.value.header) == ("a", "enrollment")
        assert gate.retire(["a", "a"]) == ["a"] and gate.retire(["a"]) == []
        with pytest.raises(NotEnrolled, match="retired"):
            gate.admit("a", enrollment.token(KEY, "a"))


# ---------------------------------------------------------------------- over gRPC


def test_register_of_an_unenrolled_id_is_refused_counted_and_logged_once(caplog):
    caplog.set_level(logging.WARNING, logger="learner.service.server")
    with running_service(**CLOSED) as (service, address):
        wrong = RawActor(address, "b", enrollment=enrollment.token(KEY, "a"))  # another id's token
        for actor in (RawActor(address, "a"), wrong, RawActor(address, "c", enrollment=enrollment.token(b"x", "c"))):
            assert _code(actor.register) == grpc.StatusCode.PERMISSION_DENIED
            actor.close()
        counts = service.accounting()
        assert (counts["credentials_refused"], counts["internal_errors"]) == (3, 0)
        assert service.actors_status() == []
        assert len([r for r in caplog.records if "not enrolled" in r.getMessage()]) == 1
        a = enrolled(address, "a")
        a.register()
        assert a.lease(1)[0]
        a.close()
        assert_honest_actor_served(service, address, enrollment=enrollment.token(KEY, "honest"))


def test_open_enrollment_admits_any_id():
    with running_service(enrollment_key=KEY, open_enrollment=True) as (service, address):
        actor = RawActor(address, "outside-ray")
        actor.register()
        assert actor.lease(1)[0] and service.accounting()["credentials_refused"] == 0
        actor.close()


def _held_open(stop: threading.Event) -> Iterator[pb.ScoredGroup]:
    stop.wait()
    yield from ()


def test_a_sybil_flood_of_unenrolled_ids_leaves_an_enrolled_actor_streaming():
    """160 ids invented by one run-token holder each try to register and to open two group streams (the
    learner's 256 slots would all be theirs); none registers or holds a slot, and the enrolled actor's
    StreamGroups is admitted and its group acked."""
    with running_service(**CLOSED) as (service, address):
        stop, calls, sybils = threading.Event(), [], []
        try:
            for i in range(SYBILS):
                sybil = RawActor(address, f"sybil-{i}", enrollment=enrollment.token(KEY, "honest"))
                sybils.append(sybil)
                assert _code(sybil.register) == grpc.StatusCode.PERMISSION_DENIED
                calls += [sybil.stub.StreamGroups(_held_open(stop), metadata=sybil.metadata()) for _ in range(2)]
            honest = connected_client(address, "honest", enrollment=enrollment.token(KEY, "honest"))
            (lease,) = honest.lease_prompts(1).prompts
            honest.send_group(make_group(lease, "honest"))
            (record,) = service.next_batch(1, timeout=10)
            assert record.actor_id == "honest"
            service.mark_consumed([record.group_id])
            assert honest.drain(10), honest.counts()
            assert (honest.counts()["queued"], honest.counts()["consumed"]) == (1, 1), honest.counts()
            assert all(call.code() == grpc.StatusCode.UNAUTHENTICATED for call in calls)
            honest.close()
        finally:
            stop.set()
            for sybil in sybils:
                sybil.close()
        counts = service.accounting()
        assert counts["credentials_refused"] == 3 * SYBILS and counts["calls_refused_busy"] == 0
        assert [a.actor_id for a in service.actors_status()] == ["honest"]


def test_a_restarted_learner_with_the_runs_key_takes_the_same_token_back():
    """A restarted driver gets the key from the fleet it re-attaches to and builds its learner with it:
    the actor moves there and re-registers with the token it holds. A learner with another key refuses it."""
    token = enrollment.token(KEY, "actor-0")
    with running_service(**CLOSED) as (first, address):
        client = connected_client(address, "actor-0", enrollment=token)
        assert client.lease_prompts(1).prompts
    with running_service(**CLOSED) as (second, address):
        client.retarget(address)
        assert client.lease_prompts(1).prompts  # refused UNAUTHENTICATED, re-registered, leased
        assert [a.actor_id for a in second.actors_status()] == ["actor-0"]
        assert second.accounting()["credentials_refused"] == 1  # the first learner's credential
    with running_service(enrollment_key=enrollment.new_key(), open_enrollment=False) as (other, address):
        client.retarget(address)
        with pytest.raises(grpc.RpcError) as refused:
            client.lease_prompts(1)
        assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
    client.close()


def test_a_retired_id_is_refused_from_then_on():
    with running_service(**CLOSED) as (service, address):
        old = enrolled(address, "actor-0")
        old.register()
        client = connected_client(address, "actor-1", enrollment=enrollment.token(KEY, "actor-1"))
        service.retire(["actor-0", "actor-1"])  # the fleet replaced them
        assert _code(lambda: old.lease(1)) == grpc.StatusCode.UNAUTHENTICATED  # its credential is gone
        assert _code(old.register) == grpc.StatusCode.PERMISSION_DENIED  # and its token with it
        with pytest.raises(grpc.RpcError) as refused:  # the client re-registers, and is refused
            client.lease_prompts(1)
        assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert service.actors_status() == []
        old.close()
        client.close()
        assert_honest_actor_served(service, address, "actor-2", enrollment=enrollment.token(KEY, "actor-2"))


def test_a_malformed_enrollment_header_is_unauthenticated_not_internal(caplog):
    caplog.set_level(logging.WARNING, logger="learner.service.server")
    request = pb.RegisterRequest(wire_version=WIRE_VERSION, actor_id="a",
                                 capabilities=pb.ActorCapabilities(**CAPABILITIES))
    key = ENROLLMENT_METADATA_KEY.encode()
    with running_service(**CLOSED) as (service, address):
        for token in ("é".encode() * enrollment.TOKEN_CHARS, b"\xe9" * enrollment.TOKEN_CHARS, b"\xff" * 4096,
                      b"0" * 4096, enrollment.token(KEY, "a").upper().encode()):
            trailers = raw_http2_call(address, "Register", request, [(key, token)])
            assert trailers.get(b"grpc-status") == UNAUTHENTICATED, (token[:40], trailers)
        over_long = RawActor(address, "a", enrollment="0" * 8000)
        assert _code(over_long.register) == grpc.StatusCode.UNAUTHENTICATED
        over_long.close()
        for _ in range(20):  # over the header bound gRPC refuses it, every time (no random band)
            over_bound = RawActor(address, "a", enrollment="0" * MAX_METADATA_BYTES)
            assert _code(over_bound.register) == grpc.StatusCode.RESOURCE_EXHAUSTED
            over_bound.close()
        counts = service.accounting()
        assert (counts["internal_errors"], counts["credentials_refused"]) == (0, 6)
        warnings = [r for r in caplog.records if "malformed enrollment" in r.getMessage()]
        assert len(warnings) == 1 and warnings[0].exc_info is None
        assert_honest_actor_served(service, address, enrollment=enrollment.token(KEY, "honest"))

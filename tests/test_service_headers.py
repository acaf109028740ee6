"""Header values are bytes from the wire: the server decodes them as UTF-8 or Latin-1, so a hostile
client holding the run token can present a credential of any characters. Each malformed one must be
refused as a wrong credential is (UNAUTHENTICATED, counted in credentials_refused), never become an
internal error, and be logged at most once per actor per minute. Sent over hand-written HTTP/2, since
grpc-python clients refuse non-ASCII metadata."""

from __future__ import annotations

import logging
import time

import grpc
from wire_helpers import CAPABILITIES, assert_honest_actor_served, raw_actor, raw_http2_call, running_service

from learner.service.actor_registry import MalformedCredential
from learner.service.credentials import CREDENTIAL_CHARS, CredentialMinter
from tandem_wire import WIRE_VERSION, pb
from tandem_wire.auth import BearerTokenInterceptor
from tandem_wire.limits import CREDENTIAL_METADATA_KEY
from tandem_wire.log_throttle import KeyedThrottle

UNAUTHENTICATED = str(grpc.StatusCode.UNAUTHENTICATED.value[0]).encode()
KEY = CREDENTIAL_METADATA_KEY.encode()


def test_verify_is_false_never_an_exception_for_any_string():
    minter = CredentialMinter(b"k" * 32)
    registration_id, credential = minter.mint("a")
    mac_chars = CREDENTIAL_CHARS - len(registration_id) - 1
    for presented in (
        "", "\x00", "é" * CREDENTIAL_CHARS, f"{registration_id}.{'é' * mac_chars}",  # non-ASCII, right length
        registration_id + "." + "\ud800" * mac_chars,  # a lone surrogate, which strict UTF-8 refuses
        registration_id + "." + "\x00" * mac_chars, credential[:-1] + "\x00",  # embedded NUL
        credential + "0", credential * 1000, "x" * 10**6,  # over-long
        credential.upper(), credential.replace(".", "-"), None, b"bytes", 7,  # wrong shape or type
    ):
        assert minter.verify("a", presented) is False, repr(presented)[:80]
    assert minter.verify("a", credential) and minter.verify("é\ud800", minter.mint("é\ud800")[1])


def test_the_run_token_check_is_false_never_an_exception_for_any_value():
    check = BearerTokenInterceptor("s3cret")
    assert check.accepts("Bearer s3cret") and check.accepts(b"Bearer s3cret")
    for presented in ("", "Bearer s3creté", "Bearer \ud800\ud800\ud800", "Bearer s3cret\x00", "Bearer s3cret" * 1000,
                      None, 7):
        assert check.accepts(presented) is False, repr(presented)[:80]


def test_the_throttle_allows_one_per_key_per_interval_in_bounded_memory():
    now = [0.0]
    throttle = KeyedThrottle(60.0, clock=lambda: now[0], max_keys=2)
    assert [throttle.allow(k) for k in ("a", "a", "b", "c", "d")] == [True, False, True, True, False]
    now[0] = 59.0
    assert not throttle.allow("a")
    now[0] = 60.0
    assert throttle.allow("a") and throttle.allow("e")  # old keys pruned to make room


def _lease(actor_id: str) -> pb.LeasePromptsRequest:
    return pb.LeasePromptsRequest(wire_version=WIRE_VERSION, actor_id=actor_id, max_prompts=1)


def _register(actor_id: str) -> pb.RegisterRequest:
    return pb.RegisterRequest(wire_version=WIRE_VERSION, actor_id=actor_id,
                              capabilities=pb.ActorCapabilities(**CAPABILITIES))


def _malformed_warnings(caplog) -> list[logging.LogRecord]:
    return [r for r in caplog.records
            if r.name == "learner.service.server" and "malformed credential" in r.getMessage()]


def test_a_non_ascii_credential_over_raw_http2_is_unauthenticated_counted_and_logged_once_per_actor(caplog):
    caplog.set_level(logging.WARNING, logger="learner.service.server")
    with running_service() as (service, address):
        a = raw_actor(address, "a")
        registration_id = a.credential.partition(".")[0]
        mac_chars = CREDENTIAL_CHARS - len(registration_id) - 1
        forged = [  # the right length in characters once decoded, with the registration id of a's credential
            f"{registration_id}.{'é' * mac_chars}".encode(),  # valid UTF-8
            registration_id.encode() + b"." + b"\xe9" * mac_chars,  # not UTF-8: decoded as Latin-1
            "é".encode() * CREDENTIAL_CHARS, b"\xff" * 4096,
        ]
        calls = [("LeasePrompts", _lease("a")), ("LeasePrompts", _lease("b")), ("StreamGroups", pb.ScoredGroup())]
        for method, request in calls:
            for credential in forged:
                trailers = raw_http2_call(address, method, request, [(KEY, credential)])
                assert trailers.get(b"grpc-status") == UNAUTHENTICATED, (method, credential[:40], trailers)
        counts = service.accounting()
        assert counts["internal_errors"] == 0
        assert counts["credentials_refused"] == len(calls) * len(forged)
        warnings = _malformed_warnings(caplog)
        assert len(warnings) == 3  # one per claimed actor ("a", "b", and a stream, which names none)
        assert all(r.exc_info is None for r in warnings)  # no traceback
        now = time.monotonic()
        service._malformed_log.clock = lambda: now + 61.0  # a minute later, one more per actor
        for _ in range(3):
            raw_http2_call(address, "LeasePrompts", _lease("a"), [(KEY, forged[0])])
        assert len(_malformed_warnings(caplog)) == 4
        assert a.lease(1)[0], "the actor whose credential was forged is still served"
        a.close()
        assert_honest_actor_served(service, address)


def test_register_of_an_existing_id_with_a_malformed_credential_is_refused_and_keeps_the_registration(caplog):
    caplog.set_level(logging.WARNING, logger="learner.service.server")
    with running_service() as (service, address):
        a = raw_actor(address, "a")
        for _ in range(5):  # needs only the run token: no credential of a's
            for credential in ("é".encode() * CREDENTIAL_CHARS, b"\xe9" * 40, b"not.a.credential"):
                trailers = raw_http2_call(address, "Register", _register("a"), [(KEY, credential)])
                assert trailers.get(b"grpc-status") == UNAUTHENTICATED, trailers
        counts = service.accounting()
        assert (counts["internal_errors"], counts["credentials_refused"], counts["actors_superseded"]) == (0, 15, 0)
        assert len(_malformed_warnings(caplog)) == 1
        assert a.lease(1)[0], "a's registration was not superseded by the refused calls"
        a.close()
        assert_honest_actor_served(service, address)


def test_a_non_ascii_run_token_over_raw_http2_is_unauthenticated():
    with running_service(auth_token="s3cret") as (service, address):
        for token in ("Bearer s3creté".encode(), b"Bearer \xe9\xe9\xe9\xe9\xe9\xe9", b"Bearer " + b"\xff" * 4096):
            trailers = raw_http2_call(address, "Status", pb.StatusRequest(), [(b"authorization", token)])
            assert trailers.get(b"grpc-status") == UNAUTHENTICATED, trailers
        trailers = raw_http2_call(address, "Status", pb.StatusRequest(), [(b"authorization", b"Bearer s3cret")])
        assert trailers.get(b"grpc-status") == b"0"
        assert service.accounting()["internal_errors"] == 0


def test_the_registry_raises_malformed_credential_naming_the_claimed_actor():
    from learner.service.actor_registry import ActorRegistry, Capabilities
    registry = ActorRegistry(max_actors=4, actor_timeout_s=30)
    registry.register("a", Capabilities("test", "qwen2", 128, 4, "localhost"), 0, presented=None)
    for call in (lambda: registry.authenticate("é" * CREDENTIAL_CHARS, "a"),
                 lambda: registry.register("a", None, 0, presented="x\x00y")):
        try:
            call()
        except MalformedCredential as error:
            assert error.actor_id == "a"
        else:
            raise AssertionError("not refused")

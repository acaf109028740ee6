"""The service's pieces without a network: credentials, the actor registry (renewal, supersession,
eviction), the weight versions an actor may name, the request bounds, and the limits on long calls."""

from __future__ import annotations

import math
import threading
import time

import pytest
from wire_helpers import FakeClock

from learner.service import request_checks
from learner.service.actor_registry import (
    ActorRegistry,
    Capabilities,
    RegistryFull,
    Superseded,
    UnknownCredential,
    WrongActor,
)
from learner.service.call_limits import AtCapacity, CallSlots
from learner.service.credentials import CredentialMinter, registration_id_of
from learner.weights.versions import NO_VERSION, UnknownWeightVersion, WeightVersions
from learner.wire_bounds import InvalidInput, check_metadata
from tandem_wire import WIRE_VERSION, pb
from tandem_wire.idle import IdleReaper
from tandem_wire.limits import MAX_ID_CHARS, MAX_LABEL_CHARS, MAX_METADATA_ENTRIES

CAPS = Capabilities("test", "qwen2", 128, 4, "localhost")


def test_a_credential_names_one_actor_and_one_learner():
    minter = CredentialMinter(b"k" * 32)
    registration_id, credential = minter.mint("actor-a")
    assert registration_id_of(credential) == registration_id and minter.verify("actor-a", credential)
    assert not minter.verify("actor-b", credential)  # bound to the actor id
    assert not CredentialMinter(b"j" * 32).verify("actor-a", credential)  # and to this learner's key
    forged = f"{registration_id}.{'0' * 64}"
    assert not minter.verify("actor-a", forged)
    for malformed in ("", registration_id, credential + "0", "x" * len(credential)):
        assert not minter.verify("actor-a", malformed)


def test_registration_renewal_keeps_the_incarnation_and_revokes_the_old_credential():
    registry = ActorRegistry(max_actors=8, actor_timeout_s=30)
    first = registry.register("a", CAPS, 0, presented=None)
    renewed = registry.register("a", CAPS, 0, presented=first.credential)
    assert renewed.superseded_seen_s is None and renewed.record.holder == first.record.holder == "a#1"
    assert registry.authenticate(renewed.credential, "a") is renewed.record
    with pytest.raises(UnknownCredential):
        registry.authenticate(first.credential)  # renewed away


def test_a_registration_without_the_credential_supersedes_and_cannot_be_taken_back():
    clock = FakeClock()
    registry = ActorRegistry(max_actors=8, actor_timeout_s=30, clock=clock)
    old = registry.register("a", CAPS, 0, presented=None)
    clock.now = 2.5
    new = registry.register("a", CAPS, 0, presented=None)  # a restarted process, or an impostor
    assert new.superseded_seen_s == 2.5 and new.record.holder == "a#2"
    with pytest.raises(Superseded):
        registry.authenticate(old.credential)
    with pytest.raises(Superseded):
        registry.register("a", CAPS, 0, presented=old.credential)  # the replaced client must stop
    assert registry.authenticate(new.credential).holder == "a#2"
    with pytest.raises(Superseded):
        registry.current("a", 1)  # a group stream opened by the old registration
    assert registry.current("a", 2) is new.record
    with pytest.raises(WrongActor):
        registry.authenticate(new.credential, actor_id="b")
    with pytest.raises(UnknownCredential):
        registry.authenticate(None)


def test_the_table_is_bounded_and_evicts_silent_actors_whose_credentials_stop_working():
    clock = FakeClock()
    registry = ActorRegistry(max_actors=2, actor_timeout_s=1.0, clock=clock)
    a = registry.register("a", CAPS, 0, None)
    registry.register("b", CAPS, 0, None)
    with pytest.raises(RegistryFull):
        registry.register("c", CAPS, 0, None)
    clock.now = 0.8
    registry.touch(registry.authenticate(registry.register("b", CAPS, 0, None).credential))
    clock.now = 1.5  # a silent past the timeout, b heard from 0.7 s ago
    registry.register("c", CAPS, 0, None)
    assert [v.actor_id for v in registry.records()] == ["b", "c"] and registry.live_count() == 2
    with pytest.raises(UnknownCredential):
        registry.authenticate(a.credential)
    with pytest.raises(UnknownCredential):
        registry.current("a", a.record.incarnation)


def test_only_published_or_restored_versions_may_be_reported():
    versions = WeightVersions()
    versions.restored(3)
    for version in (4, 7, 1_000_003):
        versions.published(version)
    for version in (3, 4, 7, 1_000_003):
        assert versions.check_reported(version) == version and versions.served(version) == version
    for version in (999, -7, 5, 0, 1_000_004):
        with pytest.raises(UnknownWeightVersion, match=f"weight version {version} was never published"):
            versions.check_reported(version)
    assert versions.served(0) == 0 and versions.served(999) == NO_VERSION and versions.served(-1) == NO_VERSION
    with pytest.raises(ValueError, match="not newer"):
        versions.published(7)


def _capabilities(**fields) -> pb.ActorCapabilities:
    base = dict(engine="vllm", model_family="qwen2", max_model_len=128, group_size=4, host="h")
    return pb.ActorCapabilities(**{**base, **fields})


@pytest.mark.parametrize("fields, detail", [
    (dict(group_size=0), "group_size 0 is not in [1, 4096]"),
    (dict(max_model_len=-4096), "max_model_len -4096 is not in [2, 16777216]"),
    (dict(host="h" * 100_000), f"host has 100000 characters > {MAX_LABEL_CHARS}"),
    (dict(engine="vllm\x1b[2J"), "non-printable"),
    (dict(max_prompt_tokens=128), "max_prompt_tokens 128 is not in [0, 127]"),
])
def test_absurd_capabilities_are_refused(fields, detail):
    with pytest.raises(InvalidInput, match=detail.replace("[", r"\[").replace("]", r"\]")):
        request_checks.capabilities(_capabilities(**fields))


def test_request_bounds():
    assert request_checks.capabilities(_capabilities(max_prompt_tokens=16)).max_prompt_tokens == 16
    for actor_id, detail in (("", "empty actor_id"), ("a" * (MAX_ID_CHARS + 1), "characters > 128")):
        with pytest.raises(InvalidInput, match=detail):
            request_checks.caller(pb.HeartbeatRequest(wire_version=WIRE_VERSION, actor_id=actor_id))
    with pytest.raises(InvalidInput, match="unsupported wire_version 0"):
        request_checks.caller(pb.HeartbeatRequest(actor_id="a"))
    for fields in (dict(weight_version=-2), dict(groups_in_flight=-1), dict(tokens_per_second=math.nan)):
        with pytest.raises(InvalidInput):
            request_checks.heartbeat(pb.HeartbeatRequest(**fields))
    shares = dict(busy=0.5, lease_wait=0.25, credit_wait=0.125, weight_stall=0.125)
    assert request_checks.heartbeat(pb.HeartbeatRequest(time_shares=pb.TimeShares(**shares)))[3].busy == 0.5
    for bad, detail in ((dict(busy=math.nan), "time_shares.busy nan is not a fraction"),
                        (dict(lease_wait=-0.1), "time_shares.lease_wait -0.1 is not a fraction"),
                        (dict(weight_stall=1.5), "time_shares.weight_stall 1.5 is not a fraction"),
                        (dict(shares, busy=0.6), "time_shares add up to 1.1 > 1")):
        with pytest.raises(InvalidInput, match=detail):
            request_checks.heartbeat(pb.HeartbeatRequest(time_shares=pb.TimeShares(**bad)))
    with pytest.raises(InvalidInput, match="detail has 1025 characters"):
        request_checks.weight_report(pb.WeightReport(detail="d" * 1025))
    with pytest.raises(InvalidInput, match="stall_seconds -1.0"):
        request_checks.weight_report(pb.WeightReport(stall_seconds=-1))
    with pytest.raises(InvalidInput, match=f"metadata has {MAX_METADATA_ENTRIES + 1} entries"):
        check_metadata({str(i): "" for i in range(MAX_METADATA_ENTRIES + 1)})


def test_call_slots_cap_all_calls_and_each_key():
    slots = CallSlots("group streams", total=3, per_key=2)
    with slots.hold("a"), slots.hold("a"):
        with pytest.raises(AtCapacity, match="per-actor limit"):
            with slots.hold("a"):
                pass
        with slots.hold("b"):
            with pytest.raises(AtCapacity, match="3 group streams are open"):
                with slots.hold("c"):
                    pass
        with slots.hold("c"):  # b's slot came back
            pass
    with slots.hold("a"), slots.hold("a"), slots.hold("b"):  # everything came back
        pass


def test_the_reaper_cancels_only_calls_without_progress():
    reaped: list[str] = []
    reaper = IdleReaper(0.3, reaped.append)
    reaper.start()
    cancelled = {"busy": threading.Event(), "idle": threading.Event()}
    try:
        with reaper.watch("busy", cancelled["busy"].set) as busy, reaper.watch("idle", cancelled["idle"].set):
            for _ in range(10):
                busy.touch()
                time.sleep(0.1)
        assert cancelled["idle"].is_set() and not cancelled["busy"].is_set() and reaped == ["idle"]
    finally:
        reaper.stop()

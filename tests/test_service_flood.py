"""Floods of cheap calls by holders of the run token (issue 41), over real gRPC on loopback: a call takes a
slot of the actor it proves it speaks for (its credential, or on Register its enrollment token), and every
call that proves nothing shares one bounded pool, so 96 threads naming an enrolled actor's id refuse none
of its calls; Status is served apart and answers every caller under a flood; a client refused as busy
tries again with back-off, counts it, and ends in an error its actor's loops ride out."""

from __future__ import annotations

import secrets
import threading
from collections import Counter
from collections.abc import Callable

import grpc
import pytest
from wire_helpers import (
    CAPABILITIES,
    RawActor,
    assert_honest_actor_served,
    connected_client,
    make_prompts,
    running_service,
    wait_until,
)

from actors.learner_client import RETRY_BACKOFF_S, LearnerBusy, LearnerUnavailable
from learner.service.call_limits import SharedReply
from learner.service.prompt_source import PromptSource
from tandem_wire import WIRE_VERSION, enrollment, pb

KEY = b"k" * enrollment.KEY_BYTES
RUN_TOKEN = "run-token"
LEGIT = "actor-legit-0"
FLOODERS = 96
PAIRS = 100


def _code(call: Callable[[], object]) -> grpc.StatusCode:
    try:
        call()
    except grpc.RpcError as error:
        return error.code()
    return grpc.StatusCode.OK


def _forged_credential() -> str:
    """A credential of the minted shape that no learner minted."""
    return f"{secrets.token_hex(16)}.{secrets.token_hex(32)}"


class Flood:
    """`threads` threads holding the run token, each on its own channel, calling `calls` (given the thread's
    RawActor, thread i's named `actor_ids(i)`) in turn until the block ends; every status code they get is
    counted."""

    def __init__(self, address: str, threads: int, calls: list[Callable[[RawActor], object]],
                 actor_ids: Callable[[int], str] = lambda _: LEGIT) -> None:
        self.codes: Counter[grpc.StatusCode] = Counter()
        self.calls_made = [0] * threads
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._actors = [RawActor(address, actor_ids(i), auth_token=RUN_TOKEN) for i in range(threads)]
        self._threads = [threading.Thread(target=self._run, args=(i, calls), daemon=True) for i in range(threads)]

    def _run(self, index: int, calls: list[Callable[[RawActor], object]]) -> None:
        actor = self._actors[index]
        while not self._stop.is_set():
            code = _code(lambda: calls[self.calls_made[index] % len(calls)](actor))
            with self._lock:
                self.codes[code] += 1
            self.calls_made[index] += 1

    def __enter__(self) -> Flood:
        for thread in self._threads:
            thread.start()
        return self

    def wait_until_all_called(self) -> None:
        wait_until(lambda: min(self.calls_made) > 0, timeout=120, what="every flooding thread made a call")

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=60)
        for actor in self._actors:
            actor.close()


def _heartbeat(actor: RawActor, credential: str | None = None) -> pb.HeartbeatReply:
    return actor.stub.Heartbeat(pb.HeartbeatRequest(wire_version=WIRE_VERSION, actor_id=actor.actor_id),
                                metadata=actor.metadata(credential), timeout=30)


def _lease(actor: RawActor) -> pb.LeasePromptsReply:
    return actor.stub.LeasePrompts(pb.LeasePromptsRequest(wire_version=WIRE_VERSION, actor_id=actor.actor_id,
                                                          max_prompts=1), metadata=actor.metadata(), timeout=30)


def _register(actor: RawActor) -> pb.RegisterReply:
    return actor.stub.Register(pb.RegisterRequest(wire_version=WIRE_VERSION, actor_id=actor.actor_id,
                                                  capabilities=pb.ActorCapabilities(**CAPABILITIES)),
                               metadata=actor.metadata(), timeout=30)


# The flood: Heartbeat with a forged credential, LeasePrompts with none, Register without an
# enrollment token, all naming the enrolled actor's id and carrying only the run token.
IMPERSONATIONS = [lambda a: _heartbeat(a, _forged_credential()), _lease, _register]


def test_96_run_token_threads_naming_an_enrolled_actor_refuse_none_of_its_calls():
    """While the service is busy (its lock held), the flood fills the pool of calls that prove no identity
    and is refused past it, and the enrolled actor's call waits its turn on a slot of its own; then it
    completes 100 Heartbeat + LeasePrompts pairs under the flood, none refused, its registration intact."""
    with running_service(PromptSource(make_prompts(64), epochs=None), auth_token=RUN_TOKEN, enrollment_key=KEY,
                         open_enrollment=False, prompts_per_step=0) as (service, address):
        legit = RawActor(address, LEGIT, auth_token=RUN_TOKEN, enrollment=enrollment.token(KEY, LEGIT))
        legit.register()
        answered: list[grpc.StatusCode] = []
        waiting = threading.Thread(target=lambda: answered.append(_code(lambda: _heartbeat(legit))))
        try:
            with Flood(address, FLOODERS, IMPERSONATIONS) as flood:
                with service._cond:  # every call that reads the service's state waits here
                    wait_until(lambda: service.accounting()["calls_refused_busy"] > 0, timeout=120,
                               what="the flood's pool full and its calls past it refused")
                    waiting.start()
                    wait_until(lambda: service._unary_calls._held[LEGIT] == 1, timeout=60,
                               what="the enrolled actor's call in a slot of its own")
                waiting.join(timeout=60)
                assert answered == [grpc.StatusCode.OK]
                flood.wait_until_all_called()
                for _ in range(PAIRS):  # the flood goes on
                    _heartbeat(legit)
                    _lease(legit)
        finally:
            legit.close()
        assert set(flood.codes) <= {grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED,
                                    grpc.StatusCode.RESOURCE_EXHAUSTED}, flood.codes
        assert sum(flood.calls_made) >= FLOODERS
        counts = service.accounting()
        assert counts["calls_refused_busy"] == flood.codes[grpc.StatusCode.RESOURCE_EXHAUSTED]  # the flood's only
        assert counts["actors_superseded"] == 0 and [a.actor_id for a in service.actors_status()] == [LEGIT]
        assert_honest_actor_served(service, address, auth_token=RUN_TOKEN, enrollment=enrollment.token(KEY, "honest"))


def _status(actor: RawActor) -> pb.StatusReply:
    return actor.stub.Status(pb.StatusRequest(), metadata=actor.metadata(), timeout=30)


def test_status_answers_every_caller_under_a_48_caller_flood():
    """48 run-token callers flood Status itself and calls that prove no identity, naming no actor (half of
    them) or a fresh id. Even while the service is busy (its lock held: Status's two builders wait there),
    Status answers the flood and another caller at once; then that caller's 50 Status calls under the
    flood are all answered."""
    with running_service(PromptSource(make_prompts(64), epochs=None), auth_token=RUN_TOKEN) as (service, address):
        operator = RawActor(address, "", auth_token=RUN_TOKEN)
        calls = [_status, _lease, _status, lambda a: _heartbeat(a, _forged_credential()), _status, _register]
        try:
            first = _status(operator)
            with Flood(address, 48, calls, actor_ids=lambda i: f"fresh-{i}" if i % 2 else "") as flood:
                flood.wait_until_all_called()
                with service._cond:
                    answered = flood.codes[grpc.StatusCode.OK]
                    wait_until(lambda: flood.codes[grpc.StatusCode.OK] >= answered + 48, timeout=120,
                               what="the flood's Status calls answered while the service is busy")
                    assert _status(operator).queue_capacity == first.queue_capacity  # the newest reply built
                replies = [_status(operator) for _ in range(50)]
        finally:
            operator.close()
        assert len(replies) == 50 and replies[-1].accounting.credentials_refused > 0  # built again since
        # open enrollment (the tests' default) registers the fresh ids; a call naming no actor is invalid
        assert set(flood.codes) <= {grpc.StatusCode.OK, grpc.StatusCode.UNAUTHENTICATED,
                                    grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED}, flood.codes


def test_status_readers_past_its_builders_share_the_newest_reply_at_once():
    """With both builders held inside a slow build (the service's lock, say), a third reader gets the
    newest reply built before, at once; a reader that finds a builder free builds a fresh one."""
    release, building = threading.Event(), threading.Semaphore(0)
    builds = iter(range(100))

    def build() -> int:
        number = next(builds)
        if number in (1, 2):  # the two blocked builds
            building.release()
            release.wait()
        return number

    reply = SharedReply(build, builders=2)
    assert reply.read() == 0
    blocked = [threading.Thread(target=reply.read) for _ in range(2)]
    for thread in blocked:
        thread.start()
    building.acquire()
    building.acquire()
    assert reply.read() == 0  # both builders busy: the newest built
    release.set()
    for thread in blocked:
        thread.join()
    assert reply.read() == 3  # a builder free: built now
    with pytest.raises(ValueError):
        SharedReply(build, builders=0)


def test_a_client_refused_busy_on_every_try_raises_learner_busy_and_counts_each_refusal():
    """The client's own calls fill its 8 slots while the service is busy: its lease is refused
    RESOURCE_EXHAUSTED on the first try and each retry, then raises LearnerBusy: a LearnerUnavailable
    (what an actor's loops ride out) and the grpc.RpcError it ended in. Once the service is free, it leases."""
    slots = 8  # unary_calls_per_actor
    with running_service(PromptSource(make_prompts(64), epochs=None)) as (service, address):
        client = connected_client(address, "a")
        stop = threading.Event()

        def heartbeats() -> None:
            while not stop.is_set():
                try:
                    client.heartbeat(0)
                except LearnerUnavailable:
                    pass

        flood = [threading.Thread(target=heartbeats) for _ in range(slots + 1)]
        try:
            with service._cond:
                for thread in flood:
                    thread.start()
                wait_until(lambda: client.calls_refused["Heartbeat RESOURCE_EXHAUSTED"] > 0, timeout=60,
                           what="the client's own slots full")
                with pytest.raises(LearnerBusy) as refused:
                    client.lease_prompts(1)
                stop.set()
        finally:
            stop.set()
            for thread in flood:
                thread.join(timeout=60)
        assert isinstance(refused.value, LearnerUnavailable) and isinstance(refused.value, grpc.RpcError)
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert f"{slots} unary calls of 'a' are open" in refused.value.details()
        assert client.calls_refused["LeasePrompts RESOURCE_EXHAUSTED"] == len(RETRY_BACKOFF_S) + 1
        assert service.accounting()["calls_refused_busy"] == sum(client.calls_refused.values())
        assert len(client.lease_prompts(1).prompts) == 1
        client.close()


def test_a_malformed_enrollment_token_is_told_what_to_present():
    with running_service(enrollment_key=KEY, open_enrollment=False) as (service, address):
        actor = RawActor(address, "a", enrollment="0" * 8000)
        with pytest.raises(grpc.RpcError) as refused:
            actor.register()
        actor.close()
    assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert refused.value.details() == ("malformed enrollment token: present the token the run's fleet minted "
                                       "for this actor id")

"""The seven ways a client holding the shared run token could hurt training (issue 15), each tried
through real gRPC on loopback by an independent raw client, plus a 200-connection storm. After each,
a legitimate actor's whole flow still works and the accounting balances exactly."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import Counter
from collections.abc import Iterator

import grpc
import numpy as np
import pytest
from wire_helpers import (
    CAPABILITIES,
    RawActor,
    assert_honest_actor_served,
    connected_client,
    make_group,
    make_prompts,
    raw_actor,
    running_service,
    server_process,
    wait_until,
    wire_accounting,
)

import learner.service.group_desk as group_desk_module
from learner.service.accounting import balance_violations
from learner.service.prompt_source import PromptSource
from tandem_wire import WIRE_VERSION, pb
from tandem_wire.limits import MAX_ACK_DETAIL_CHARS, MAX_ID_CHARS

STATUS_DEADLINE_S = 1.0


def test_1_a_group_for_a_prompt_leased_to_another_actor_is_invalid_and_the_holders_is_consumed():
    with running_service() as (service, address):
        holder = connected_client(address, "holder")
        (lease,) = holder.lease_prompts(1).prompts
        impostor = raw_actor(address, "impostor")
        acks = impostor.exchange([
            make_group(lease, "impostor", seed=1),  # its own name, someone else's prompt
            make_group(lease, "holder", seed=1),  # the holder's name on its own stream
        ])
        assert [(a.status, a.detail) for a in acks] == [
            (pb.ACK_STATUS_INVALID, f"prompt {lease.group_id} is leased to another actor"),
            (pb.ACK_STATUS_INVALID, "actor_id 'holder' is not the stream's actor 'impostor'"),
        ]
        holder.send_group(make_group(lease, "holder", seed=2))
        (record,) = service.next_batch(1, timeout=10)
        assert (record.group_id, record.actor_id) == (lease.group_id, "holder")
        service.mark_consumed([record.group_id])
        assert holder.drain(10) and holder.counts()["consumed"] == 1
        counts = service.accounting()
        assert (counts["groups_invalid"], counts["lease_violations"], counts["groups_consumed"]) == (2, 1, 1)
        assert counts["groups_duplicate"] == 0 and balance_violations(counts) == []
        holder.close()
        impostor.close()
        assert_honest_actor_served(service, address)


def _rejection(lease, actor_id: str) -> pb.ScoredGroup:
    return pb.ScoredGroup(wire_version=WIRE_VERSION, group_id=lease.group_id, actor_id=actor_id,
                          prompt_token_ids=lease.prompt_ids, rejected_reason="prompt_too_long")


def test_2_nobody_retires_another_actors_prompt_and_a_false_prompt_too_long_is_refused():
    with running_service(max_prompt_tokens=8) as (service, address):
        holder = raw_actor(address, "holder")
        (lease,), _ = holder.lease(1)  # 5 tokens, within the run's limit of 8
        impostor = raw_actor(address, "impostor")
        (ack,) = impostor.exchange([_rejection(lease, "impostor")])
        assert (ack.status, ack.detail) == (
            pb.ACK_STATUS_INVALID, f"prompt {lease.group_id} is leased to another actor")
        (ack,) = holder.exchange([_rejection(lease, "holder")])  # the holder's own claim is checked too
        assert (ack.status, ack.detail) == (
            pb.ACK_STATUS_INVALID, "prompt_too_long refused: the prompt has 5 tokens, within the limit 8")
        (ack,) = holder.exchange([make_group(lease, "holder")])
        assert ack.status == pb.ACK_STATUS_QUEUED  # not retired, not a duplicate
        counts = service.accounting()
        assert (counts["prompts_too_long"], counts["prompts_retired"], counts["groups_invalid"],
                counts["lease_violations"]) == (0, 0, 2, 1)
        assert balance_violations(counts) == []
        holder.close()
        impostor.close()
        assert_honest_actor_served(service, address)


def test_3_a_5000_digit_group_id_and_an_unexpected_exception_each_get_a_counted_invalid_ack(monkeypatch, caplog):
    with running_service() as (service, address):
        actor = raw_actor(address)
        leases, _ = actor.lease(2)
        huge = make_group(leases[0], actor.actor_id)
        huge.group_id = "1" * 5000 + ":0"
        boom = make_group(leases[1], actor.actor_id, seed=1)
        boom.metadata["boom"] = "1"
        real_decide = group_desk_module.decide

        def decide(record, *args):
            if "boom" in record.metadata:
                raise ValueError("an admission bug")
            return real_decide(record, *args)

        monkeypatch.setattr(group_desk_module, "decide", decide)
        with caplog.at_level(logging.WARNING, logger="learner.service.server"):
            acks = actor.exchange([huge, boom, make_group(leases[0], actor.actor_id)])  # stream goes on
        assert [(a.status, a.detail) for a in acks] == [
            (pb.ACK_STATUS_INVALID, f"group_id has {len(huge.group_id)} characters > {MAX_ID_CHARS}"),
            (pb.ACK_STATUS_INVALID, "internal error: ValueError"),
            (pb.ACK_STATUS_QUEUED, ""),
        ]
        assert acks[0].group_id == huge.group_id[:MAX_ID_CHARS]
        (warning,) = [r for r in caplog.records if "unexpected error admitting" in r.getMessage()]
        assert warning.levelno == logging.WARNING and "an admission bug" in caplog.text and warning.exc_info
        counts = service.accounting()
        assert (counts["groups_received"], counts["groups_invalid"], counts["internal_errors"]) == (3, 2, 1)
        assert balance_violations(counts) == []
        monkeypatch.undo()
        actor.close()
        assert_honest_actor_served(service, address)


@pytest.mark.parametrize("actor_id, capabilities, detail", [
    ("a", {**CAPABILITIES, "group_size": 0}, "group_size 0 is not in [1, 4096]"),
    ("a", {**CAPABILITIES, "max_model_len": -4096}, "max_model_len -4096 is not in [2, 16777216]"),
    ("a", {**CAPABILITIES, "host": "h" * 100_000}, "host has 100000 characters > 256"),
    ("a" * 100_000, CAPABILITIES, "actor_id has 100000 characters > 128"),
])
def test_4_absurd_capabilities_and_ids_are_refused_at_register(actor_id, capabilities, detail):
    with running_service() as (service, address):
        with pytest.raises(grpc.RpcError) as error:
            RawActor(address, actor_id).register(capabilities)
        assert (error.value.code(), error.value.details()) == (grpc.StatusCode.INVALID_ARGUMENT, detail)
        assert service.actors_status() == [] and service.accounting()["requests_invalid"] == 1
        assert_honest_actor_served(service, address)


def _huge_id_groups(lease, actor_id: str, count: int, id_bytes: int,
                    stop: threading.Event) -> Iterator[pb.ScoredGroup]:
    """`count` groups with `id_bytes`-character ids, then silence (the stream stays open) until `stop`."""
    for i in range(count):
        group = make_group(lease, actor_id)
        group.group_id = str(i % 10) * id_bytes
        yield group
    stop.wait(60)


def test_5_acks_echo_a_bounded_prefix_so_a_client_that_never_reads_them_costs_bounded_memory():
    """64 groups with 1 MiB ids, acks unread: before the fix each ack held its id (+64 MiB); now an
    ack is a few hundred bytes, and the unread stream is cancelled as idle."""
    count, id_bytes = 64, 1 << 20
    with server_process(group_size=4, vocab_size=64, stream_idle_timeout_s=3.0) as (address, process):
        actor = raw_actor(address, "hoarder")
        (lease,), _ = actor.lease(1)
        rss_before = process.memory_info().rss
        stop = threading.Event()
        call = actor.stub.StreamGroups(_huge_id_groups(lease, "hoarder", count, id_bytes, stop),
                                       metadata=actor.metadata())
        wait_until(lambda: wire_accounting(actor.stub)["groups_received"] == count, timeout=60,
                   what="every huge group admitted while no ack is read")
        grown = process.memory_info().rss - rss_before
        print(f"\nserver RSS +{grown >> 20} MiB after {count} unread acks of {id_bytes >> 20} MiB ids")
        assert grown < 32 << 20, f"server RSS grew {grown >> 20} MiB holding unread acks"
        acks = [next(call) for _ in range(count)]
        assert {a.status for a in acks} == {pb.ACK_STATUS_INVALID}
        assert all(len(a.group_id) == MAX_ID_CHARS and len(a.detail) <= MAX_ACK_DETAIL_CHARS for a in acks)
        assert max(a.ByteSize() for a in acks) < 512
        with pytest.raises(grpc.RpcError) as error:  # nothing more arrives: cancelled as idle
            next(call)
        assert error.value.code() == grpc.StatusCode.CANCELLED
        stop.set()
        counts = wire_accounting(actor.stub)
        assert counts["streams_idle_closed"] == 1 and counts["groups_invalid"] == count
        (ack,) = actor.exchange([make_group(lease, "hoarder")])  # the actor's real group is still welcome
        assert ack.status == pb.ACK_STATUS_QUEUED
        counts = wire_accounting(actor.stub)
        assert counts["groups_queued"] == 1 and balance_violations(counts) == []
        actor.close()


def test_6_weight_reports_must_name_a_published_version():
    with running_service() as (service, address):
        for version in (1, 2):
            service.publish_weights(version, [("w", np.zeros(4, np.float32))])
        actor = raw_actor(address)
        report = dict(actor_id=actor.actor_id, applied=True, stall_seconds=0.1)
        for version in (999, -7):
            with pytest.raises(grpc.RpcError) as error:
                actor.stub.ReportWeights(pb.WeightReport(version=version, **report), metadata=actor.metadata())
            assert (error.value.code(), error.value.details()) == (
                grpc.StatusCode.INVALID_ARGUMENT, f"weight version {version} was never published by this learner")
        actor.stub.Heartbeat(pb.HeartbeatRequest(wire_version=WIRE_VERSION, actor_id=actor.actor_id,
                                                 weight_version=999), metadata=actor.metadata())
        (view,) = service.actors_status()
        assert view.weight_version == -1 and view.last_weight_report is None  # nothing nonsensical recorded
        actor.stub.ReportWeights(pb.WeightReport(version=2, **report), metadata=actor.metadata())
        (view,) = service.actors_status()
        assert view.weight_version == 2 and view.last_weight_report["version"] == 2
        assert service.accounting()["weight_reports_refused"] == 2
        client = connected_client(address, "restarted-learner-reader")  # the actor side never raises on it
        assert client.report_weights(2, applied=True) and not client.report_weights(999, applied=True)
        assert service.accounting()["weight_reports_refused"] == 3
        client.close()
        actor.close()
        assert_honest_actor_served(service, address)


def _idle_requests(stop: threading.Event) -> Iterator[pb.ScoredGroup]:
    stop.wait(60)
    return
    yield


@contextlib.contextmanager
def _open_streams(actors: list[RawActor], per_actor: int) -> Iterator[list]:
    """`per_actor` idle StreamGroups calls for each actor, each on its own channel; yields the calls."""
    stop = threading.Event()
    opened: list[tuple[RawActor, object]] = []
    try:
        for actor in actors:
            for _ in range(per_actor):
                own = RawActor(actor.address, actor.actor_id)
                own.credential = actor.credential
                opened.append((own, own.stub.StreamGroups(_idle_requests(stop), metadata=own.metadata())))
        yield [call for _, call in opened]
    finally:
        stop.set()
        for own, call in opened:
            call.cancel()
            own.close()


def _refused_busy(calls: list) -> int:
    """How many of `calls` ended RESOURCE_EXHAUSTED (the admitted ones are still open)."""
    return sum(call.done() and call.code() == grpc.StatusCode.RESOURCE_EXHAUSTED for call in calls)


def _status_latency(actor: RawActor) -> float:
    start = time.monotonic()
    actor.stub.Status(pb.StatusRequest(), timeout=5)
    return time.monotonic() - start


def test_7_one_token_holder_opening_300_idle_streams_starves_nobody():
    with running_service() as (service, address):
        hog = raw_actor(address, "hog")
        with _open_streams([hog], 300) as calls:
            wait_until(lambda: _refused_busy(calls) == 298, timeout=60,
                       what="all but the per-actor limit of streams refused")
            assert service.accounting()["calls_refused_busy"] == 298 and sum(not c.done() for c in calls) == 2
            latencies = [_status_latency(hog) for _ in range(5)]
            assert max(latencies) < STATUS_DEADLINE_S, latencies
            other = connected_client(address, "neighbour")  # heartbeat, lease and weights still served
            other.heartbeat(0)
            assert len(other.lease_prompts(1).prompts) == 1
            other.close()
        assert service.accounting()["calls_refused_busy"] == 298
        assert_honest_actor_served(service, address)


def test_a_200_connection_storm_leaves_status_answering_within_a_second():
    """100 token holders open 2 idle streams each, on 200 connections. The learner holds at most 64
    (its global limit here), refuses the rest at once, answers Status throughout, and cancels the ones
    it holds when they stay idle (on a slow machine a stream opened after the first cancellations may
    take a freed slot instead of being refused: every stream ends one way or the other)."""
    with running_service(PromptSource(make_prompts(64)), max_streams=64, stream_idle_timeout_s=2.0) as (service,
                                                                                                     address):
        stormers = [raw_actor(address, f"storm-{i}") for i in range(100)]
        with _open_streams(stormers, 2) as calls:
            latencies = [_status_latency(stormers[0]) for _ in range(5)]
            assert max(latencies) < STATUS_DEADLINE_S, latencies
            wait_until(lambda: all(call.done() for call in calls), timeout=60, what="every storm stream ended")
            codes = Counter(call.code() for call in calls)
        for actor in stormers:
            actor.close()
        counts = service.accounting()
        refused, cancelled = codes[grpc.StatusCode.RESOURCE_EXHAUSTED], codes[grpc.StatusCode.CANCELLED]
        assert refused + cancelled == 200 and cancelled >= 64, codes
        assert (counts["calls_refused_busy"], counts["streams_idle_closed"]) == (refused, cancelled)
        assert_honest_actor_served(service, address)


def _fetch(actor: RawActor, credential: bool) -> object:
    """An unread FetchWeights call of `actor`, with its credential or (anonymous) the run token alone."""
    request = pb.FetchWeightsRequest(wire_version=WIRE_VERSION, actor_id=actor.actor_id, version=0)
    return actor.stub.FetchWeights(request, metadata=actor.metadata() if credential else actor.token)


def test_8_one_actor_holds_at_most_its_share_of_the_weight_streams():
    """Weight streams are capped per registered actor (its credential names it) and, for callers without
    one, together: a hog opening 6 unread streams of each kind holds 2 + 4 of the 32, and another actor
    fetches the whole version meanwhile."""
    with running_service(weight_chunk_bytes=1 << 12) as (service, address):
        service.publish_weights(1, [("w", np.zeros(1 << 22, np.float32))])  # 16 MiB: unread, a stream stays open
        hog = raw_actor(address, "hog")
        calls = [_fetch(hog, credential=True) for _ in range(6)] + [_fetch(hog, credential=False) for _ in range(6)]
        try:
            wait_until(lambda: _refused_busy(calls) == 6, timeout=30, what="the calls past the caps refused")
            # which calls of a kind the server took first is up to its threads: count, per kind, the open ones
            assert (sum(not c.done() for c in calls[:6]), sum(not c.done() for c in calls[6:])) == (2, 4)
            assert service.accounting()["calls_refused_busy"] == 6
            other = connected_client(address, "neighbour", shared_memory=False)
            staged = other.fetch_weights()
            assert staged.version == 1
            other.close()
        finally:
            for call in calls:
                call.cancel()
            hog.close()
        assert_honest_actor_served(service, address)


def test_9_one_actor_id_holds_at_most_its_share_of_the_unary_workers():
    """Unary calls are capped per claimed actor id: while the service is busy (its lock held), 10
    concurrent leases of one id hold 8 workers and 2 are refused at once; another actor's call waits
    its turn and is answered."""
    with running_service(PromptSource(make_prompts(64))) as (service, address):
        hog, other = raw_actor(address, "hog"), raw_actor(address, "other")
        results: list[object] = []

        def lease(actor: RawActor) -> None:
            try:
                results.append(len(actor.lease(1)[0]))
            except grpc.RpcError as error:
                results.append(error.code())

        with service._cond:  # every call that needs the service's state waits here
            threads = [threading.Thread(target=lease, args=(hog,)) for _ in range(10)]
            threads.append(threading.Thread(target=lease, args=(other,)))
            for thread in threads:
                thread.start()
            wait_until(lambda: results.count(grpc.StatusCode.RESOURCE_EXHAUSTED) == 2, timeout=30,
                       what="the hog's calls past its cap refused")
        for thread in threads:
            thread.join(timeout=30)
        assert sorted(map(str, results)) == sorted(["1"] * 9 + [str(grpc.StatusCode.RESOURCE_EXHAUSTED)] * 2)
        assert service.accounting()["calls_refused_busy"] == 2
        hog.close()
        other.close()
        assert_honest_actor_served(service, address)

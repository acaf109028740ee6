"""A rollout actor rides out a learner that refuses it as busy (issue 41): a RolloutActor in this process
(real vLLM engine, real learner service on loopback gRPC, real reward pool on Ray) whose lease and whose
registration are refused RESOURCE_EXHAUSTED keeps its sampling loop, asks again after a back-off, counts
every refusal, and samples as soon as the flood stops."""

from __future__ import annotations

import threading

import pytest
from actors_helpers import addition_prompts, exact_match_pool, make_base_model, wait_for
from config_helpers import actor_config, service_config

from actors.learner_client import RETRY_BACKOFF_S, LearnerUnavailable, LeaseReply
from actors.rollout_actor import RolloutActor
from actors.stats import ActorStats
from learner.service.prompt_source import PromptSource
from learner.service.server import LearnerService
from models.tokenizer import vocab_size_for

pytestmark = pytest.mark.slow  # Ray and vLLM actors

G = 4
SLOTS = 8  # the learner's unary_calls_per_actor
TRIES = len(RETRY_BACKOFF_S) + 1  # a client call's tries before it gives up (LearnerBusy)
GROUPS_AFTER = 4


def test_an_actor_refused_busy_keeps_its_loop_and_samples_once_the_flood_stops(ray_session, tmp_path):
    base = make_base_model(tmp_path / "base")
    pool = exact_match_pool()
    service = LearnerService(PromptSource(addition_prompts([(12, 30), (7, 8)]), epochs=None), service_config(
        queue_capacity=8, max_staleness=1000, group_size=G, vocab_size=vocab_size_for()))
    address = service.start()
    config = actor_config(base, group_size=G, max_tokens=8, max_model_len=64, kv_cache_gib=0.125,
                          prompts_per_batch=2, num_cpus=0)
    actor = RolloutActor("actor-0", config, address, pool.handles())
    stop_flood, finished = threading.Event(), []

    def own_calls() -> None:  # calls with the actor's own credential: the only ones that take its slots
        while not stop_flood.is_set():
            try:
                actor.client.heartbeat(0)
            except LearnerUnavailable:
                pass

    flood = [threading.Thread(target=own_calls) for _ in range(SLOTS + 1)]
    runner = threading.Thread(target=lambda: finished.append(actor.run()))
    try:
        actor.client.register(actor.capabilities(), actor.version)
        refused = actor.client.calls_refused
        with service._cond:  # the learner is busy: the flood's calls wait in the actor's slots
            for thread in flood:
                thread.start()
            wait_for(lambda: refused["Heartbeat RESOURCE_EXHAUSTED"] > 0, what="the actor's slots full")
            # the sampling loop's lease is refused on every try, and answered as "no prompts yet"
            assert actor._lease(2) == LeaseReply([], False, 0.0)
            assert refused["LeasePrompts RESOURCE_EXHAUSTED"] == TRIES
            runner.start()  # run() registers first: refused on every try, then asked again
            wait_for(lambda: refused["Register RESOURCE_EXHAUSTED"] > TRIES, what="a refused Register asked again")
            assert runner.is_alive()
            stop_flood.set()
        for thread in flood:
            thread.join(timeout=60)
        received = 0
        while received < GROUPS_AFTER:  # sampling once the flood stopped
            batch = service.next_batch(GROUPS_AFTER - received, timeout=120)
            assert batch, f"no group from the actor after the flood: {actor.stats()}"
            service.mark_consumed([record.group_id for record in batch])
            received += len(batch)
        stats = actor.stop()
        runner.join(timeout=60)
    finally:
        stop_flood.set()
        actor.client.close()
        actor.engine.shutdown()
        service.stop()
        pool.shutdown()
    assert len(finished) == 1 and isinstance(finished[0], ActorStats)  # run() returned, never raised
    assert stats.groups_sent >= GROUPS_AFTER
    assert stats.calls_refused["LeasePrompts RESOURCE_EXHAUSTED"] == TRIES
    assert stats.calls_refused["Register RESOURCE_EXHAUSTED"] > TRIES
    assert service.accounting()["calls_refused_busy"] == sum(stats.calls_refused.values())

"""Adapter versions end to end: a real LearnerService publishes LoRA adapter versions 1..4 over loopback
gRPC (η = 1) while one real RolloutActor (a Ray actor with a vLLM engine) samples; each version is loaded
under its own name, the oldest unloaded, greedy outputs follow each version's merged weights, every group
carries the version that sampled it (its logprobs are that version's), and no request or version fails."""

from __future__ import annotations

import time

import numpy as np
import pytest
import ray
from actors_helpers import (
    addition_prompts,
    exact_match_pool,
    greedy_tokens,
    hf_model,
    load_tensors,
    merged_weights,
    random_adapter,
    sampled_token_logprobs,
    wait_for,
    write_weights_dir,
)
from config_helpers import actor_config, service_config

from actors.fleet import ActorFleet
from learner.service.prompt_source import PromptSource
from learner.service.server import GroupRecord, LearnerService
from models.peft import LoraConfig, adapter_config
from models.tokenizer import vocab_size_for

pytestmark = pytest.mark.slow  # Ray and vLLM actors

G = 2
TEMPERATURE = 0.7
ETA = 1  # rollout.max_staleness: the actor keeps η + 1 adapter versions loaded
LORA = LoraConfig(rank=4, alpha=8.0)
VERSIONS = (1, 2, 3, 4)
PAIRS = [(12, 30), (7, 8), (101, 5), (64, 64), (3, 99), (45, 54), (250, 250), (9, 1)]


def consume(service: LearnerService, n: int, version: int, seen: set[int], timeout: float = 120.0) -> list[GroupRecord]:
    """Act as the trainer: take groups off the queue, mark them consumed, keep those of `version`; `seen`
    collects the version of every group taken."""
    kept: list[GroupRecord] = []
    deadline = time.monotonic() + timeout
    while len(kept) < n:
        assert time.monotonic() < deadline, f"only {len(kept)} of {n} groups of version {version} arrived"
        batch = service.next_batch(1, timeout=5.0)
        service.mark_consumed([r.group_id for r in batch])
        seen |= {r.policy_version for r in batch}
        kept += [r for r in batch if r.policy_version == version]
    return kept


def test_adapter_versions_load_under_their_names_and_the_oldest_unloads_while_the_actor_samples(
        ray_session, tmp_path, weight_dirs):
    base = weight_dirs["sharp_a"]  # sharp weights: greedy outputs free of near-ties
    adapters = {v: random_adapter(base, LORA, seed=100 + v) for v in VERSIONS}
    merged = {v: hf_model(write_weights_dir(base, tmp_path / f"v{v}", merged_weights(load_tensors(base), adapters[v],
                                                                                      LORA.scale)))
              for v in VERSIONS}
    rows = addition_prompts(PAIRS)
    prompts = [row.prompt_ids for row in rows]
    pool = exact_match_pool()
    service = LearnerService(
        PromptSource(rows, epochs=None, seed=0),
        service_config(max_staleness=ETA, group_size=G, lease_seconds=30.0, vocab_size=vocab_size_for(),
                       heartbeat_interval_s=0.5))
    address = service.start()
    config = actor_config(base, group_size=G, temperature=TEMPERATURE, max_tokens=8, max_model_len=64,
                          kv_cache_gib=0.125, prompts_per_batch=2, num_cpus=0, lora=LORA, lora_versions_kept=ETA + 1)
    fleet = ActorFleet(config, address, pool.handles())
    try:
        def publish(version: int) -> None:  # as RLLoop does: the step, then the version it trained
            service.set_step(version - 1)
            service.publish_weights(version, adapters[version].items(), adapter=adapter_config(LORA, "learner/base"))

        publish(1)  # before the actor exists: it joins late, and loads the base plus the current adapter
        [actor_id] = fleet.scale(1)
        actor = fleet.actors()[actor_id]
        previous, seen = None, set()
        for version in VERSIONS:
            if version > 1:
                publish(version)
            wait_for(lambda v=version: ray.get(actor.stats.remote()).version == v, what=f"version {version} applied")
            records = consume(service, 2, version, seen)
            deltas = np.concatenate([
                np.abs(np.asarray(c.logprobs) - sampled_token_logprobs(merged[version], r.prompt_ids, c.token_ids,
                                                                        TEMPERATURE))
                for r in records for c in r.completions])
            assert deltas.mean() < 1e-3, (version, deltas.mean())  # sampled with that version's adapter
            greedy = ray.get(actor.greedy.remote(prompts[:3], 8))
            assert greedy == [greedy_tokens(merged[version], p, 8, eos_token_id=2) for p in prompts[:3]]
            assert greedy != previous
            previous = greedy
            kept = tuple(f"policy-v{v}" for v in VERSIONS if version - ETA <= v <= version)
            # the version that left the window is unloaded once its last group in flight is done
            wait_for(lambda k=kept: ray.get(actor.stats.remote()).adapters == k, what=f"adapters {kept} loaded")
        assert seen <= set(VERSIONS), seen  # joining late, it never sampled with the bare base (version 0)
        stats = ray.get(actor.stats.remote())
        assert stats.versions_applied == VERSIONS and stats.weight_rejections == 0
        counts = service.accounting()
        assert counts["groups_invalid"] == 0 and counts["groups_retry"] == 0, counts
        [view] = service.actors_status()
        assert view.weight_version == VERSIONS[-1] and view.last_weight_report["applied"]
    finally:
        fleet.shutdown()
        pool.shutdown()
        service.stop()

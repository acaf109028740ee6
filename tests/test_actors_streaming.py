"""Abort-and-resample, step by step: a RolloutActor (in this process, real vLLM engine, real learner
service on loopback gRPC, real reward pool on Ray) loads a new weight version while its groups are
half sampled. The groups in flight are aborted, their tokens counted as thrown away, and sampled
again on the new weights, so every group the learner receives carries the version that produced all
of its tokens and behaviour logprobs equal to that version's (checked against transformers)."""

from __future__ import annotations

import numpy as np
import pytest
from actors_helpers import (
    chat_prompt,
    hf_model,
    load_tensors,
    make_base_model,
    random_weights,
    sampled_token_logprobs,
    write_weights_dir,
)
from config_helpers import actor_config, service_config

from actors.rollout_actor import RolloutActor
from learner.prompt_source import Prompt, PromptSource
from learner.service import LearnerService
from models.tokenizer import vocab_size_for
from rewards.pool import RewardPool, RewardSpec, WeightedReward

G = 4
TEMPERATURE = 0.7


@pytest.fixture
def actor_and_service(ray_session, tmp_path):
    base = make_base_model(tmp_path / "base")
    sharp = write_weights_dir(base, tmp_path / "sharp", random_weights(load_tensors(base), seed=1))
    pool = RewardPool(RewardSpec(functions=[WeightedReward(ref="exact_match")]), num_workers=1)
    prompts = [Prompt(chat_prompt(f"{a}+{b}"), f"{a}+{b}", {"answer": str(a + b)}) for a, b in [(12, 30), (7, 8)]]
    service = LearnerService(PromptSource(prompts), service_config(
        queue_capacity=8, max_staleness=1000, group_size=G, lease_seconds=60.0, vocab_size=vocab_size_for()))
    address = service.start()
    config = actor_config(base, group_size=G, temperature=TEMPERATURE, max_tokens=12, max_model_len=64,
                          kv_cache_gib=0.125, prompts_per_batch=2, num_cpus=0)
    actor = RolloutActor("actor-0", config, address, pool.handles())
    actor.client.register(actor.capabilities(), actor.version)
    yield actor, service, sharp
    actor.client.close()
    actor.engine.shutdown()
    service.stop()
    pool.shutdown()


def test_a_version_loaded_mid_sampling_aborts_the_groups_in_flight_and_samples_them_again(actor_and_service):
    actor, service, sharp = actor_and_service
    actor._submit(actor.client.lease_prompts(2).prompts)
    actor._step_engine()  # every completion has its first token from version 0
    assert actor.engine.in_flight == 2 and not actor._scoring

    service.publish_weights(1, load_tensors(sharp).items())
    actor._maybe_update_weights(1)  # what the weights thread does between two steps
    assert actor.version == 1 and actor.stats().versions_applied == (1,)
    assert actor.stats().tokens_aborted >= 2 * G  # at least the first token of each completion
    assert actor.engine.in_flight == 2 and {g.version for g in actor._in_engine.values()} == {1}

    while actor._in_engine or actor._scoring:
        actor._step_engine()
        actor._send_scored(wait_s=0.05)
    records = service.next_batch(2, timeout=30)
    assert len(records) == 2 and {r.policy_version for r in records} == {1}
    model = hf_model(sharp)
    deltas = np.concatenate([
        np.abs(np.asarray(c.logprobs) - sampled_token_logprobs(model, r.prompt_ids, c.token_ids, TEMPERATURE))
        for r in records for c in r.completions])
    assert deltas.max() < 1e-3, deltas.max()  # every token from version 1, none left from version 0
    stats = actor.stats()
    assert stats.groups_sent == 2 and stats.tokens_generated == sum(len(c.token_ids) for r in records
                                                                    for c in r.completions)

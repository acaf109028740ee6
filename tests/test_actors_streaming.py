"""A new weight version reaching a streaming actor whose groups are half sampled, step by step: a
RolloutActor in this process (real vLLM engine, real learner service on loopback gRPC, real reward
pool on Ray). Under rollout.weight_update=abort it stops leasing and drains: the groups in flight finish
on the weights they started with, then the version is loaded. With no drain allowed
(weight_drain_steps=0) the groups in flight are aborted, their tokens counted as thrown away, and sampled
again on the new weights. Either way every group the learner receives carries the version that produced
all of its tokens, with that version's behaviour logprobs (checked against transformers). Under keep,
three versions load while the groups are in flight, which continue on each: nothing is thrown away, and
every token reaches the learner with the version that sampled it and that version's logprob. In sync mode
nothing is in flight between two calls: a version loads at once and the next batch is sampled whole with it."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
from actors_helpers import (
    addition_prompts,
    exact_match_pool,
    hf_model,
    in_process_actor,
    load_tensors,
    sampled_token_logprobs,
)
from config_helpers import actor_config, service_config

from learner.service.prompt_source import PromptSource
from learner.service.server import LearnerService
from models.tokenizer import vocab_size_for

pytestmark = pytest.mark.slow  # Ray and vLLM actors

G = 4
TEMPERATURE = 0.7


@contextlib.contextmanager
def _actor_and_service(weight_dirs, **config):
    """An in-process actor over the base checkpoint (version 0) serving a learner with two prompts; the HF
    dirs of versions 0 to 3 (base, sharp_a, sharp_b, sharp_c)."""
    pool = exact_match_pool()
    service = LearnerService(PromptSource(addition_prompts([(12, 30), (7, 8)]), epochs=None), service_config(
        queue_capacity=8, max_staleness=1000, group_size=G, lease_seconds=60.0, vocab_size=vocab_size_for()))
    config = actor_config(weight_dirs["base"], group_size=G, temperature=TEMPERATURE, max_model_len=64,
                          kv_cache_gib=0.125, prompts_per_batch=2, num_cpus=0, **config)
    with in_process_actor(config, service, pool) as actor:
        yield actor, service, dict(enumerate(weight_dirs[name] for name in ("base", "sharp_a", "sharp_b", "sharp_c")))


@pytest.fixture(params=[64, 0], ids=["drain", "abort"])
def actor_and_service(ray_session, weight_dirs, request):
    with _actor_and_service(weight_dirs, max_tokens=12, weight_update="abort", weight_drain_steps=request.param) as (
            actor_service_dirs):
        yield actor_service_dirs


def test_a_version_arriving_mid_sampling_drains_or_aborts_and_every_group_keeps_one_version(actor_and_service):
    actor, service, dirs = actor_and_service
    drain = actor.config.weight_drain_steps > 0
    actor._submit(actor.client.lease_prompts(2).prompts)
    actor.sampler.step()  # every completion has its first token from version 0
    assert actor.engine.in_flight == 2 and not actor.sampler.scoring

    service.publish_weights(1, load_tensors(dirs[1]).items())
    actor._maybe_update_weights(1)  # what the weights thread does: fetched and checked, waiting
    assert actor.version == 0 and actor._weights.pending_version == 1 and actor.engine.in_flight == 2
    steps = 0
    while actor.sampler.in_engine or actor.sampler.scoring:
        actor.sampler.step()
        actor._load_when_drained()
        actor.sampler.collect(wait_s=0.05)
        steps += 1
        if drain:
            assert actor.version == (1 if not actor.sampler.in_engine else 0)  # loaded only once drained
    assert actor.version == 1 and actor.stats().versions_applied == (1,) and actor._weights.pending_version is None
    if drain:
        expected_version, aborted = 0, 0
    else:  # loaded after the first step; at least the first token of each completion thrown away
        expected_version, aborted = 1, actor.stats().tokens_aborted
        assert aborted >= 2 * G
    assert actor.stats().tokens_aborted == aborted

    records = service.next_batch(2, timeout=30)
    assert len(records) == 2 and {r.policy_version for r in records} == {expected_version}
    model = hf_model(dirs[expected_version])
    deltas = np.concatenate([
        np.abs(np.asarray(c.logprobs) - sampled_token_logprobs(model, r.prompt_ids, c.token_ids, TEMPERATURE))
        for r in records for c in r.completions])
    assert deltas.max() < 1e-3, deltas.max()  # every token from that one version
    stats = actor.stats()
    assert stats.groups_sent == 2 and stats.tokens_generated == sum(len(c.token_ids) for r in records
                                                                    for c in r.completions)


@pytest.mark.parametrize("actor_and_service", [64], ids=["drain"], indirect=True)
def test_a_lease_back_while_its_group_is_in_the_engine_or_being_scored_is_not_sampled_again(actor_and_service):
    """A lease that expired while the actor sampled it comes back to it (short leases, a loaded
    machine, a restarted learner re-issuing). The copy in the engine or waiting for its scores will
    reach the learner, so the lease is skipped. Sampled again, the second copy ended the sampling
    loop ("group ... is already waiting for an ack"; CI's learner-restart test stalled on it)."""
    actor, _, _ = actor_and_service
    [lease] = actor.client.lease_prompts(1).prompts
    actor._submit([lease])
    assert actor._fitting([lease]) == []  # in the engine
    while lease.group_id in actor.sampler.in_engine:
        actor.sampler.step()
    assert [scoring.sampled.lease.group_id for scoring in actor.sampler.scoring] == [lease.group_id]
    assert actor._fitting([lease]) == []  # being scored
    actor.sampler.collect(wait_s=60)
    assert not actor.sampler.scoring and actor.counters.groups_sent == 1


def test_three_versions_load_while_groups_are_in_flight_and_every_token_keeps_its_version(ray_session, weight_dirs):
    """weight_update=keep: versions 1, 2 and 3 each load a few engine steps apart while both groups are in
    flight. No request fails or is aborted, no token is thrown away, and every token of every group the
    learner takes carries the version that sampled it, whose logprob transformers gives on that version's
    weights for the same prompt and prefix (the KV before an update is recomputed on the new weights)."""
    with _actor_and_service(weight_dirs, max_tokens=40, weight_update="keep") as (actor, service, dirs):
        actor._submit(actor.client.lease_prompts(2).prompts)
        for version in (1, 2, 3):
            for _ in range(3):
                actor.sampler.step()
            assert actor.engine.in_flight == 2, "both groups must be in flight at each update"
            service.publish_weights(version, load_tensors(dirs[version]).items())
            actor._maybe_update_weights(version)  # what the weights thread does; keep: loaded at once
            assert actor.version == version and actor._weights.pending_version is None
        while actor.sampler.in_engine or actor.sampler.scoring:
            actor.sampler.step()
            actor.sampler.collect(wait_s=0.05)
        stats = actor.stats()
        assert stats.versions_applied == (1, 2, 3) and stats.tokens_aborted == 0 and stats.groups_sent == 2
        assert stats.tokens_recomputed > 0

        records = service.next_batch(2, timeout=30)
        assert len(records) == 2 and all(r.policy_version == 0 for r in records)
        completions = [(r.prompt_ids, c) for r in records for c in r.completions]
        assert all(c.finish_reason in ("stop", "length") for _, c in completions)
        for _, c in completions:
            # one token per engine step: the first three from version 0, the next three from 1, then 2, ...
            assert c.versions == [min(i // 3, 3) for i in range(len(c.token_ids))]
        assert max(len(c.token_ids) for _, c in completions) > 9, "no completion reached version 3"
        models = {version: hf_model(path) for version, path in dirs.items()}
        deltas = np.concatenate([
            np.abs(np.asarray(c.logprobs)[np.asarray(c.versions) == version]
                   - sampled_token_logprobs(models[version], prompt, c.token_ids, TEMPERATURE)[
                       np.asarray(c.versions) == version])
            for prompt, c in completions for version in models])
        assert deltas.max() < 1e-3, deltas.max()
        assert stats.tokens_generated == sum(len(c.token_ids) for _, c in completions)


def test_sync_mode_loads_a_version_at_once_and_samples_a_leased_batch_whole_with_it(ray_session, weight_dirs):
    """rollout.sync (actors/samplers/batch.py): nothing is in the engine between two calls, so a version
    offered while a batch waits to be sampled loads at once, even under weight_update=abort; one step then
    samples the whole batch with it and collect sends every group, each token with that version's logprob."""
    with _actor_and_service(weight_dirs, max_tokens=8, sync=True, weight_update="abort") as (actor, service, dirs):
        actor._submit(actor.client.lease_prompts(2).prompts)
        service.publish_weights(1, load_tensors(dirs[1]).items())
        actor._maybe_update_weights(1)
        assert actor.version == 1 and actor._weights.pending_version is None and actor.engine.in_flight == 0
        actor.sampler.step()
        assert actor.engine.in_flight == 0 and actor.counters.groups_sent == 0  # sampled and scored, not sent
        actor.sampler.collect()
        assert actor.counters.groups_sent == 2 and not actor.sampler.held()
        assert actor.stats().tokens_aborted == 0

        records = service.next_batch(2, timeout=30)
        assert len(records) == 2 and {r.policy_version for r in records} == {1}
        assert all(len(r.completions) == G for r in records)
        model = hf_model(dirs[1])
        deltas = np.concatenate([
            np.abs(np.asarray(c.logprobs) - sampled_token_logprobs(model, r.prompt_ids, c.token_ids, TEMPERATURE))
            for r in records for c in r.completions])
        assert deltas.max() < 1e-3, deltas.max()

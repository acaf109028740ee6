"""One RolloutActor (a real Ray actor with a vLLM engine) against the real LearnerService on loopback
gRPC, scored by a real reward pool; behaviour logprobs checked against transformers."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import ray
from actors_helpers import (
    addition_prompts,
    chat_prompt,
    exact_match_pool,
    greedy_tokens,
    hf_model,
    load_tensors,
    sampled_token_logprobs,
    wait_for,
)
from config_helpers import actor_config, service_config
from weight_faults import damaging, flip_a_byte

import learner.weights.desk as desk_module
from actors.fleet import ActorFleet
from actors.stats import ActorStats
from launch.config import load_config
from learner.service.prompt_source import Prompt, PromptSource
from learner.service.server import GroupRecord, LearnerService
from models.tokenizer import vocab_size_for

pytestmark = pytest.mark.slow  # Ray and vLLM actors

G = 4
TEMPERATURE = 0.7
MAX_PROMPT_TOKENS = 16
QUEUE_CAPACITY = 4
LONG_PROMPT_INDEX = 5


def dataset() -> list[Prompt]:
    rows = addition_prompts([(12, 30), (7, 8), (101, 5), (64, 64), (3, 999), (45, 54), (250, 250), (9, 1)])
    long_text = "1+" * 10 + "1"  # 21 characters + 3 special tokens > MAX_PROMPT_TOKENS
    rows[LONG_PROMPT_INDEX] = Prompt(chat_prompt(long_text), long_text, {"answer": "11"})
    return rows


@dataclass
class Rig:
    service: LearnerService
    fleet: ActorFleet
    actor: ray.actor.ActorHandle
    dirs: dict[str, Path]
    version: int = 0

    def publish(self, name: str, tensors: dict[str, np.ndarray] | None = None) -> int:
        """Publish the named weight dir (or explicit tensors) as the next version."""
        self.version += 1
        self.service.publish_weights(self.version, (tensors or load_tensors(self.dirs[name])).items())
        return self.version

    def stats(self) -> ActorStats:
        return ray.get(self.actor.stats.remote())

    def consume(self, n: int, version: int | None = None, timeout: float = 300.0) -> list[GroupRecord]:
        """Act as the trainer: take groups off the queue, mark them consumed, keep those of ``version``."""
        kept: list[GroupRecord] = []
        deadline = time.monotonic() + timeout
        while len(kept) < n:
            remaining = deadline - time.monotonic()
            assert remaining > 0, f"only {len(kept)} of {n} groups of version {version} arrived"
            batch = self.service.next_batch(1, timeout=min(remaining, 5.0))
            self.service.mark_consumed([r.group_id for r in batch])
            kept += [r for r in batch if version is None or r.policy_version == version]
        return kept


@pytest.fixture(scope="module")
def rig(ray_session, weight_dirs):
    dirs, base = weight_dirs, weight_dirs["base"]
    pool = exact_match_pool()
    service = LearnerService(
        PromptSource(dataset(), epochs=None, seed=0),
        service_config(queue_capacity=QUEUE_CAPACITY, max_staleness=1000, group_size=G, lease_seconds=30.0,
                       vocab_size=vocab_size_for(), heartbeat_interval_s=0.5))
    address = service.start()
    config = actor_config(base, group_size=G, temperature=TEMPERATURE, max_tokens=10,
                          max_prompt_tokens=MAX_PROMPT_TOKENS, max_model_len=64, kv_cache_gib=0.125,
                          prompts_per_batch=2, weight_retry_s=0.5, num_cpus=0)
    fleet = ActorFleet(config, address, pool.handles())
    rig = Rig(service, fleet, None, dirs)
    # published before the actor exists: it must catch up to version 1 before its first sample
    rig.publish("sharp_a")
    [actor_id] = fleet.scale(1)
    rig.actor = fleet.actors()[actor_id]
    yield rig
    fleet.shutdown()
    pool.shutdown()
    service.stop()


def logprob_deltas(records: list[GroupRecord], hf_dir: Path) -> np.ndarray:
    model = hf_model(hf_dir)
    deltas = [np.abs(np.asarray(c.logprobs)
                     - sampled_token_logprobs(model, r.prompt_ids, c.token_ids, TEMPERATURE))
              for r in records for c in r.completions]
    return np.concatenate(deltas)


def test_actor_catches_up_then_groups_carry_g_completions_with_true_behaviour_logprobs(rig):
    records = rig.consume(4)  # the first groups of the run
    assert [r.policy_version for r in records] == [1] * 4, "sampled before catching up to version 1"
    stats = rig.stats()
    assert stats.versions_applied[0] == 1 and len(stats.stall_seconds) >= 1
    counts = rig.service.accounting()  # it caught up over the bulk path: the stream carried no blob
    assert 0 < counts["weight_bytes_streamed"] < counts["weight_bytes_shared"] / 10, counts
    for r in records:
        assert len(r.completions) == G
        assert r.actor_id == stats.actor_id
        for c in r.completions:
            assert len(c.token_ids) == len(c.logprobs) >= 1
            assert c.reward in (0.0, 1.0) and c.unscorable_reason is None  # exact_match scored it
    deltas = logprob_deltas(records, rig.dirs["sharp_a"])
    assert deltas.mean() < 1e-3, deltas.mean()


def test_new_version_is_applied_between_generations_and_changes_outputs(rig):
    prompts = [row.prompt_ids for row in dataset()[:3]]
    before = ray.get(rig.actor.greedy.remote(prompts, 8))
    version = rig.publish("sharp_b" if rig.version % 2 else "sharp_c")
    name = "sharp_b" if version % 2 == 0 else "sharp_c"
    wait_for(lambda: rig.stats().version == version, what=f"actor applying version {version}")

    after = ray.get(rig.actor.greedy.remote(prompts, 8))
    oracle = hf_model(rig.dirs[name])
    assert after == [greedy_tokens(oracle, p, 8, eos_token_id=2) for p in prompts]
    assert after != before
    records = rig.consume(2, version=version)
    assert logprob_deltas(records, rig.dirs[name]).mean() < 1e-3
    [view] = rig.service.actors_status()
    assert view.weight_version == version
    assert view.last_weight_report["applied"] and view.last_weight_report["version"] == version


def _nan(tensors):
    bad = dict(tensors)
    bad["model.norm.weight"] = np.full_like(bad["model.norm.weight"], np.nan)
    return bad


def _wrong_shape(tensors):
    bad = dict(tensors)
    bad["lm_head.weight"] = bad["lm_head.weight"][:-1]
    return bad


@pytest.mark.parametrize("corruption", ["nan", "wrong_shape", "flipped_byte"])
def test_corrupted_publish_is_rejected_and_the_old_version_keeps_serving(rig, corruption, monkeypatch):
    prompts = [row.prompt_ids for row in dataset()[:3]]
    serving = rig.stats().version
    before = ray.get(rig.actor.greedy.remote(prompts, 8))
    rejections = rig.stats().weight_rejections
    good = load_tensors(rig.dirs["sharp_a"])
    if corruption == "flipped_byte":
        # A corruption after the digest was taken: a payload byte flips in the stream and the shared file.
        monkeypatch.setattr(desk_module, "pack_weights", damaging(desk_module.pack_weights, {
            rig.version + 1: flip_a_byte}))
        version = rig.publish("sharp_a", good)
        monkeypatch.undo()
        expected_detail = "blake3 mismatch"
    else:
        version = rig.publish("", {"nan": _nan, "wrong_shape": _wrong_shape}[corruption](good))
        expected_detail = {"nan": "non-finite", "wrong_shape": "shape"}[corruption]

    wait_for(lambda: rig.stats().weight_rejections > rejections, what="the actor rejecting the version")
    report = wait_for(lambda: [v.last_weight_report for v in rig.service.actors_status()
                               if v.last_weight_report and v.last_weight_report["version"] == version],
                      what="the rejection report")[0]
    assert not report["applied"] and expected_detail in report["detail"]
    assert rig.stats().version == serving
    assert ray.get(rig.actor.greedy.remote(prompts, 8)) == before
    assert rig.consume(1, version=serving)  # still sampling, with the old weights


def test_too_long_prompts_are_reported_to_the_learner_not_sampled(rig):
    long_ids = dataset()[LONG_PROMPT_INDEX].prompt_ids
    wait_for(lambda: rig.service.accounting()["prompts_too_long"] >= 1, what="a prompt_too_long report")
    assert rig.stats().prompts_filtered >= 1
    records = rig.consume(len(dataset()))
    assert all(r.prompt_ids != long_ids for r in records)
    assert all(len(r.prompt_ids) <= MAX_PROMPT_TOKENS for r in records)


def test_backpressure_stops_the_actor_at_the_queue_bound_with_flat_memory(rig):
    # the trainer stops consuming: the queue fills, then the actor must stop producing
    wait_for(lambda: rig.service.queue_depth() == QUEUE_CAPACITY, what="a full queue")
    time.sleep(2.0)  # let the actor run into its credit limit
    first = rig.stats()
    samples = []
    for _ in range(6):
        time.sleep(1.0)
        samples.append((rig.service.queue_depth(), rig.stats()))
    assert all(depth <= QUEUE_CAPACITY for depth, _ in samples)
    last = samples[-1][1]
    assert last.groups_sent - first.groups_sent <= 1, (first.groups_sent, last.groups_sent)
    assert last.unacked <= QUEUE_CAPACITY + load_config(None).rollout.prompts_per_batch + 2
    assert last.rss_bytes - first.rss_bytes < 32 * 2**20, (first.rss_bytes, last.rss_bytes)
    # its heartbeats say where its time went: blocked on credits, not sampling
    [status] = rig.service.actors_status()
    shares = status.time_shares
    assert shares.credit_wait > 0.8 and shares.busy < 0.1, shares

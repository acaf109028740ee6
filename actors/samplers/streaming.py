"""Async single-turn mode: up to ``prompts_per_batch`` groups in the engine at once, stepped one engine step
at a time; each group is scored as soon as its last completion finishes and sent once scored, so no group
waits for the longest completion of a batch (the actor leases the room it leaves again).

A new weight version meets the groups in flight as ``rollout.weight_update`` says (actors/samplers/updates.py):
continued on it (keep) or drained, the rest aborted and sampled again on it (abort).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import ray

from actors.engine import Sample
from actors.groups import scored_group
from actors.learner_client import Prompt
from actors.samplers.base import Sampler, SamplerRig
from actors.samplers.updates import WeightUpdatePolicy

SCORE_POLL_S = 0.05  # with nothing in the engine, how long collect() waits at most for one group's scores


@dataclass
class InEngine:
    """A leased prompt whose group the engine is sampling."""

    lease: Prompt
    version: int  # the weights served when it was submitted (its tokens carry their own, Sample.versions)
    sampled_at: float  # wall clock at submission
    started: float  # perf_counter at submission


@dataclass
class Scoring:
    """A sampled group waiting for its scores."""

    sampled: InEngine
    samples: list[Sample]
    sample_s: float
    score_started: float
    ref: ray.ObjectRef


class StreamingSampler(Sampler):
    """``in_engine``: group id -> its group being sampled; ``scoring``: sampled groups waiting for scores."""

    def __init__(self, rig: SamplerRig, updates: WeightUpdatePolicy) -> None:
        super().__init__(rig, updates)
        self.in_engine: dict[str, InEngine] = {}
        self.scoring: list[Scoring] = []

    def held(self) -> set[str]:
        return set(self.in_engine) | {scoring.sampled.lease.group_id for scoring in self.scoring}

    def submit(self, leases: Sequence[Prompt]) -> None:
        for lease in leases:
            with self.rig.engine_lock:
                self._submit_one(lease)

    @property
    def sampling_count(self) -> int:
        return len(self.in_engine)

    def step(self) -> None:
        """One engine step; start scoring every group it finished."""
        rig = self.rig
        with rig.engine_lock:
            with self.generating():
                finished = self.engine.poll()
            done = time.perf_counter()
            groups = [(self.in_engine.pop(key), samples) for key, samples in finished]
        for sampled, samples in groups:
            rig.counters.tokens_generated += sum(len(s.token_ids) for s in samples)
            ref = rig.scorer.score_async(sampled.lease.text, [(c.text, c.token_ids) for c in samples],
                                         sampled.lease.metadata)
            self.scoring.append(Scoring(sampled, samples, done - sampled.started, time.perf_counter(), ref))

    def collect(self, wait_s: float | None = None) -> None:
        """Send the groups whose scores are in, in order, waiting up to `wait_s` for the first (by default
        not at all while the engine has groups to step, else SCORE_POLL_S)."""
        if wait_s is None:
            wait_s = 0.0 if self.in_engine else SCORE_POLL_S
        rig = self.rig
        ready = rig.scorer.ready([s.ref for s in self.scoring], wait_s)
        for scoring in [s for s, is_ready in zip(self.scoring, ready, strict=True) if is_ready]:
            self.scoring.remove(scoring)
            [scores] = rig.scorer.gather([scoring.ref])
            sampled = scoring.sampled
            rig.send(scored_group(
                group_id=sampled.lease.group_id, actor_id=rig.actor_id, prompt_ids=sampled.lease.prompt_ids,
                samples=scoring.samples, scores=scores,
                metadata=sampled.lease.metadata, sample_seconds=scoring.sample_s,
                score_seconds=time.perf_counter() - scoring.score_started, sampled_at=sampled.sampled_at))
            rig.counters.groups_sent += 1

    def resubmit(self, keys: Sequence[str]) -> None:
        for key in keys:
            self._submit_one(self.in_engine[key].lease)

    def _submit_one(self, lease: Prompt) -> None:
        """Add one lease's group to the engine, sampled with the version served now (engine lock held)."""
        self.engine.submit(lease.group_id, lease.prompt_ids, self.rig.sampling)
        self.in_engine[lease.group_id] = InEngine(lease, self.rig.version(), time.time(), time.perf_counter())

"""Sync mode (``ActorConfig.sync``): a leased batch is sampled whole, scored, and sent.

The lease budget with η = 0 paces it: after a batch sampled with version v the actor is refused until
the learner has trained on it and the engine serves the newer version, so sampling and training
alternate instead of overlapping (the baseline the asynchronous modes are measured against). Nothing
stays in the engine between two calls, so a new version always loads at once (KeepInFlight, with
nothing in flight).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from actors.engine import Sample
from actors.groups import scored_group
from actors.learner_client import Prompt
from actors.samplers.base import Sampler, SamplerRig
from actors.samplers.updates import KeepInFlight
from rewards.types import ScoreResult


@dataclass(frozen=True)
class _Scored:
    """A group of the batch, sampled and scored, waiting to be sent."""

    lease: Prompt
    samples: list[Sample]
    scores: list[ScoreResult]
    sample_seconds: float  # the batch's, shared out among its groups
    score_seconds: float
    sampled_at: float


class BatchSampler(Sampler):
    """``step`` samples the leased batch whole and scores it; ``collect`` sends it."""

    def __init__(self, rig: SamplerRig) -> None:
        super().__init__(rig, KeepInFlight())
        self._batch: list[Prompt] = []  # leased, sampled by the next step
        self._scored: list[_Scored] = []  # sampled and scored by the last step, sent by the next collect

    def held(self) -> set[str]:
        return {lease.group_id for lease in self._batch} | {scored.lease.group_id for scored in self._scored}

    @property
    def sampling_count(self) -> int:
        return len(self._batch)

    def submit(self, leases: Sequence[Prompt]) -> None:
        self._batch.extend(leases)

    def step(self) -> None:
        """Sample the batch whole and score it."""
        rig, fits, self._batch = self.rig, self._batch, []
        sampled_at = time.time()
        with rig.engine_lock:
            start = time.perf_counter()
            with self.generating():
                groups = self.engine.generate([lease.prompt_ids for lease in fits], rig.sampling)
            sample_s = time.perf_counter() - start
        rig.counters.tokens_generated += sum(len(s.token_ids) for g in groups for s in g)

        start = time.perf_counter()
        pending = [rig.scorer.score_async(lease.text, [(c.text, c.token_ids) for c in group], lease.metadata)
                   for lease, group in zip(fits, groups, strict=True)]
        all_scores = rig.scorer.gather(pending)
        score_s = time.perf_counter() - start
        self._scored = [_Scored(lease, samples, scores, sample_s / len(fits), score_s / len(fits), sampled_at)
                        for lease, samples, scores in zip(fits, groups, all_scores, strict=True)]

    def collect(self) -> None:
        """Send the batch the last step sampled and scored."""
        rig, scored, self._scored = self.rig, self._scored, []
        for group in scored:
            rig.send(scored_group(
                group_id=group.lease.group_id, actor_id=rig.actor_id, prompt_ids=group.lease.prompt_ids,
                samples=group.samples, scores=group.scores, metadata=group.lease.metadata,
                sample_seconds=group.sample_seconds, score_seconds=group.score_seconds, sampled_at=group.sampled_at))
            rig.counters.groups_sent += 1

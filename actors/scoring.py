"""Score sampled groups on the reward pool's Ray workers, called directly from the rollout actor.

The actor gets the pool's worker handles (``RewardPool.handles()``) rather than the pool itself, so
scoring needs no round trip through the process that owns the pool.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import ray

from rewards.types import ScoreResult


class RewardScorer:
    """Spreads groups over reward workers round-robin; each call scores one whole group."""

    def __init__(self, handles: Sequence[ray.actor.ActorHandle]):
        if not handles:
            raise ValueError("a rollout actor needs at least one reward worker handle")
        self._next = itertools.cycle(list(handles))

    def score_async(self, prompt: str, completions: list[tuple[str, list[int]]],
                    metadata: dict[str, str]) -> ray.ObjectRef:
        """Start scoring ``(text, token_ids)`` completions of one prompt; resolves to list[ScoreResult]."""
        return next(self._next).score_group.remote(prompt, completions, dict(metadata))

    @staticmethod
    def ready(refs: list[ray.ObjectRef], timeout_s: float) -> list[bool]:
        """Which of `refs` have their scores, waiting up to `timeout_s` for the first one."""
        if not refs:
            return []
        done, _ = ray.wait(refs, num_returns=1, timeout=timeout_s)
        if done:  # take every one that is in by now, without waiting further
            done, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
        finished = set(done)
        return [ref in finished for ref in refs]

    @staticmethod
    def gather(refs: list[ray.ObjectRef]) -> list[list[ScoreResult]]:
        """Wait for every group's scores, in order."""
        return ray.get(refs)

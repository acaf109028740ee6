"""The result type reward workers hand to rollout actors, and their counts of what they scored."""

from __future__ import annotations

import collections
from dataclasses import dataclass, field


@dataclass(frozen=True)
class ScoreResult:
    """The reward of one completion, or why it has none.

    Exactly one of the two fields is set: a finite ``reward``, or an ``unscorable_reason`` such as
    ``"math_answer:timeout"`` (``<component name>:<reason>``). Unscorable completions must never be
    treated as reward 0: the learner drops or masks them.
    """

    reward: float | None
    unscorable_reason: str | None = None

    def __post_init__(self) -> None:
        if (self.reward is None) == (self.unscorable_reason is None):
            raise ValueError(f"exactly one of reward / unscorable_reason must be set, got {self}")

    @property
    def scorable(self) -> bool:
        return self.reward is not None


@dataclass(frozen=True)
class RewardStats:
    """What reward scoring did (``IsolatedScorer.stats()``, ``RewardPool.stats()`` summed over workers).

    ``a + b`` adds two counts, so a pool sums its workers' with ``sum(stats, RewardStats())``."""

    scored: int = 0
    """completions given a reward"""
    unscorable: int = 0
    """completions left without one"""
    restarts: int = 0
    """isolated child processes replaced after a timeout or a crash"""
    failures: dict[str, int] = field(default_factory=dict)
    """failed reward calls by ``<component>:<reason>``, and failed environment calls by ``environment:<reason>``"""
    episodes: int = 0
    """environment episodes started (multi-turn)"""
    steps: int = 0
    """environment steps taken"""

    def __add__(self, other: RewardStats) -> RewardStats:
        failures = collections.Counter(self.failures)
        failures.update(other.failures)
        return RewardStats(self.scored + other.scored, self.unscorable + other.unscorable,
                           self.restarts + other.restarts, dict(failures), self.episodes + other.episodes,
                           self.steps + other.steps)

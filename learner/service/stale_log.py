"""Why groups were dropped as stale: with leases bounded by version (learner/service/lease_budget.py) a stale
drop is an anomaly, so each one is classified and the run summary says which causes occurred.

Causes, judged from the group's policy version v, the learner's newest version w and the first
version this learner process published (its restored one after a restart):
  before_restore      v is older than anything this learner published: the group was sampled before
                      a learner restart (or from weights this learner never served)
  behind_on_arrival   the actor sampled with weights more than max_staleness versions behind w when
                      the group arrived (an actor slow to load new weights, or one that restarted)
  behind_in_queue     the group was fresh when it arrived but the learner moved on more than
                      max_staleness versions while it waited in the queue
Counts cover this learner process (the accounting's groups_stale counters are the checkpointed
totals); the last EXAMPLES drops are kept with their versions and actor.
"""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import asdict, dataclass
from typing import Any

EXAMPLES = 20


@dataclass(frozen=True)
class StaleDrop:
    cause: str
    group_id: str
    actor_id: str
    policy_version: int
    latest_version: int


class StaleLog:
    """Counts of stale drops by cause, and the latest few of them. Not thread-safe (the service's lock)."""

    def __init__(self) -> None:
        self._counts: Counter[str] = Counter()
        self._examples: deque[StaleDrop] = deque(maxlen=EXAMPLES)

    def record(self, *, in_queue: bool, group_id: str, actor_id: str, policy_version: int, latest_version: int,
               first_published: int | None) -> str:
        """Classify one drop (see the module docstring) and keep it; returns its cause."""
        if first_published is not None and policy_version < first_published:
            cause = "before_restore"
        else:
            cause = "behind_in_queue" if in_queue else "behind_on_arrival"
        self._counts[cause] += 1
        self._examples.append(StaleDrop(cause, group_id[:64], actor_id[:64], policy_version, latest_version))
        return cause

    def report(self) -> dict[str, Any]:
        return {"causes": dict(self._counts), "latest": [asdict(drop) for drop in self._examples]}

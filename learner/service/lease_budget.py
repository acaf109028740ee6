"""How many prompts the learner may have in use: admission bounded by version, not by queue size.

AReaL's rule (areal/core/staleness_manager.py). With B = prompts_per_step, η = max_staleness and s the
learner step at which the weights of the asking actor were published (at most the steps completed;
learner/service/pacing.py picks it), a lease never takes the prompts in use past

    (η + s + 1) · B,        in use = issued - returned

- issued counts every slot taken: each lease (of a new prompt, and each re-issue of one), and a group
  queued for a prompt whose slot had been given back (a late copy from an earlier holder);
- returned counts every slot given back: the expired lease a re-issue replaces, a group dropped as
  stale (on arrival or at dequeue), a prompt rejected as too long, and a group retired without being
  trained on (dynamic sampling's zero-signal groups).

A trained group keeps its slot for good, so s steps hold s·B slots and actors may sample at most
η + 1 batches ahead of the learner: a prompt leased within the bound is trained on before the
learner is η versions further, so in steady state no group is dropped as stale. An actor that asks
for more gets fewer or none, and a hint for when to ask again (StepPace; the pacing table,
learner/service/pacing.py). The queue's capacity stays a memory bound only.

Both classes are pure (no locks, no clock of their own); PromptSource keeps the budget's counts
under its lock and in its checkpointed state, the learner service owns the pace.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

RETRY_MIN_S = 0.05  # the shortest retry hint: an actor never asks more often than this
RETRY_MAX_S = 2.0  # the longest: slots also come back between steps (stale drops, rejections)
PACE_WINDOW = 8  # step intervals averaged for the hint


@dataclass
class LeaseBudget:
    """The counts of the module docstring. prompts_per_step = 0 leases without a bound (a source no
    learner service limits: supervised tools, unit tests of leasing)."""

    prompts_per_step: int = 0
    max_staleness: int = 0
    issued: int = 0
    returned: int = 0

    def __post_init__(self) -> None:
        if self.prompts_per_step < 0 or self.max_staleness < 0:
            raise ValueError(f"need prompts_per_step >= 0 and max_staleness >= 0, got "
                             f"{self.prompts_per_step}, {self.max_staleness}")

    @property
    def in_use(self) -> int:
        return self.issued - self.returned

    def limit(self, step: int) -> int | None:
        """(η + s + 1)·B after `step` learner steps; None when unbounded."""
        if not self.prompts_per_step:
            return None
        return (self.max_staleness + step + 1) * self.prompts_per_step

    def allowance(self, step: int) -> int | None:
        """Slots that may still be taken after `step` steps (0 when the budget is spent); None when
        unbounded."""
        limit = self.limit(step)
        return None if limit is None else max(0, limit - self.in_use)

    def take(self, slots: int = 1) -> None:
        self.issued += slots

    def give_back(self, slots: int = 1) -> None:
        if slots > self.in_use:
            raise ValueError(f"giving back {slots} slots, only {self.in_use} in use")
        self.returned += slots

    def state_dict(self) -> dict[str, int]:
        return {"issued": self.issued, "returned": self.returned}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.issued, self.returned = int(state["issued"]), int(state["returned"])


class StepPace:
    """When the learner's next step is expected: the hint an actor refused for lack of budget gets.

    The hint is the mean of the last PACE_WINDOW step intervals less the time since the last step;
    once a step is overdue, a quarter of that mean (so a slow step is polled a few times, not spun
    on). Before two steps are seen it is the time since the first one (or since start), which
    doubles the wait while nothing is known. Always within [RETRY_MIN_S, RETRY_MAX_S]."""

    def __init__(self, now: float) -> None:
        self._last = now
        self._intervals: deque[float] = deque(maxlen=PACE_WINDOW)

    def stepped(self, now: float) -> None:
        """A learner step completed at `now`."""
        self._intervals.append(now - self._last)
        self._last = now

    def retry_after(self, now: float) -> float:
        elapsed = now - self._last
        if self._intervals:
            mean = sum(self._intervals) / len(self._intervals)
            wait = max(mean - elapsed, mean / 4)
        else:
            wait = elapsed
        return min(max(wait, RETRY_MIN_S), RETRY_MAX_S)

"""Holding a step back for groups that are about to go stale (`rollout.late_group_wait_s`, off by default).

The lease budget (learner/service/lease_budget.py) bounds how many prompts are in use, the queue trains the
oldest policy version first (learner/service/group_queue.py), and an actor η versions behind gets no lease
unless it refused the newest version (learner/service/pacing.py). None of them stops the learner from
publishing the version that makes a group still being sampled by a slower actor stale. With a hold,
while such a group is out (leased at budget step s − η or earlier, by an actor that has not loaded newer
weights since), the batch of step s + 1 takes no group, so the late one comes first instead of being
dropped after the step. The hold is bounded per step, ends when those leases expire (a dead actor), and
is skipped while the queue is full (the late groups could not get in).

Off by default, by measurement: with the other three rules, 2 actors at η = 1 dropped 0 groups in 30
steps without it (idle and under a CPU hog; on a loaded 2-core CI machine 0 in most runs, at most 4),
while a 5 s hold cut the 1-actor demo's async speed from 83 to 54-59 RL steps/min: in steady state the
learner held every step for the actor's drain and reload.
It is for fleets with a persistently slower actor, whose groups are overtaken every step.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class LateGroupWait:
    """The per-step bound of the hold, and what holding cost (reported in the run summary)."""

    wait_s: float
    """the longest a step holds for late groups; 0 = never"""
    steps_waited: int = 0
    """steps whose batch was held for late groups"""
    seconds_waited: float = 0.0
    steps_given_up: int = 0
    """steps whose hold ran out with late groups still out (they are dropped as stale if they come)"""
    _step: int = -1
    _until: float = 0.0
    _held_since: float | None = None
    _waited_step: int = -1  # the last step counted in steps_waited
    _given_up_step: int = -1  # the last step counted in steps_given_up

    def hold(self, step: int, now: float, late: int, expires_in: float) -> float:
        """Seconds to hold the batch of step + 1 for `late` groups whose first lease expires in
        `expires_in` s; 0: take groups now. The first call of a step starts its bound."""
        if step != self._step:
            self.release(now)
            self._step, self._until = step, now + self.wait_s
        if late and now < self._until:
            if self._held_since is None:
                self._held_since = now
            self.steps_waited += self._waited_step != step
            self._waited_step = step
            return max(min(self._until - now, expires_in), 1e-3)
        self.release(now)
        if late:
            self.steps_given_up += self._given_up_step != step
            self._given_up_step = step
        return 0.0

    def release(self, now: float) -> None:
        """The hold (if any) ends now: count its time."""
        if self._held_since is not None:
            self.seconds_waited += now - self._held_since
            self._held_since = None

    def report(self) -> dict[str, float]:
        return {"steps_waited": self.steps_waited, "seconds_waited": round(self.seconds_waited, 3),
                "steps_given_up": self.steps_given_up}

"""Pacing: which actor may lease prompts, at which budget step, and when one given fewer than it asked
for should ask again, as pure functions.

The rule (AReaL's, learner/service/lease_budget.py). With B = prompts_per_step, η = max_staleness, t the
learner's steps done and s the asking actor's budget step (the step the version it serves was
published at, at most t: `budget_step`), an actor may lease when

    η = 0  or  s > t − η                (`may_lease`: what it samples can still arrive fresh)
           or  s = t − η and it refused the newest version (it cannot load newer weights, and its
               groups are fresh until the learner's next step)

and the prompt source (learner/service/prompt_source.py) then grants up to the n prompts it asked for,
expired leases first (their re-issue keeps their slot), new prompts while the slots in use stay
within (η + s + 1)·B (B = 0: unbounded); for an actor out of bound the source is not asked (g = 0).
The decision is split at the lease because how many the source can grant (free re-issues, the end of
the dataset) is the source's to know, and the hint depends on it: `may_lease` comes before the lease,
`decide_lease` after it and turns what the source granted (g of n) into the reply's retry hint, with
a = the slots the budget still allows at s after the lease, a_t those at t (None: unbounded). Its
rows, in order:

    g = n (n = 0 included)                  GRANTED       hint 0: it got what it asked for
    source exhausted                        EXHAUSTED     hint 0: nothing more will come
    out of bound (not `may_lease`)          OUT_OF_BOUND  hint RETRY_MIN_S: it loads newer weights first
    slots left at s (a ≠ 0, or unbounded)   DRY           hint 0: the slots did not hold it back, the
                                                          source had no more prompts to issue now
    s < t and slots left at t (a_t ≠ 0)     LAGGING       hint RETRY_MIN_S: its version's slots are
                                                          spent, a newer version (announced) has some
    otherwise                               WAIT_STEP     hint = when the learner's next step is due
                                                          (StepPace, in [RETRY_MIN_S, RETRY_MAX_S])

A hint of 0 means "ask again when you want"; the actor also asks again at once when the learner
announces a publish, a step or slots given back on its group stream. No clock is read here: the
step's due time comes in as a number.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass

from learner.service.lease_budget import RETRY_MIN_S


class Pace(enum.Enum):
    """The row of the table that decided a lease's reply."""

    GRANTED = "granted"
    EXHAUSTED = "exhausted"
    OUT_OF_BOUND = "out of bound"
    DRY = "dry"
    LAGGING = "lagging"
    WAIT_STEP = "wait for the next step"


@dataclass(frozen=True)
class LeaseAsk:
    """An actor's request, and where the learner and the actor's weights stand (before leasing)."""

    wanted: int  # n: prompts asked for (already capped at the per-lease maximum)
    learner_step: int  # t
    budget_step: int  # s (`budget_step`)
    max_staleness: int  # η
    refused_newest: bool = False  # the actor's last weight report: the newest version, not applied


@dataclass(frozen=True)
class LeaseOutcome:
    """What the source granted and where the budget and the learner's pace stand after the lease."""

    granted: int  # g (0 when the actor may not lease)
    exhausted: bool  # every epoch issued and no prompt outstanding
    allowance: int | None  # a: slots left at the budget step s (None: unbounded)
    allowance_now: int | None  # a_t: slots left at the learner's step t (None: unbounded)
    step_due_in_s: float  # StepPace's hint: seconds until the learner's next step is due


@dataclass(frozen=True)
class LeaseDecision:
    pace: Pace
    retry_after_s: float  # the reply's retry_after_seconds (0: no hint)


def budget_step(learner_step: int, version: int, version_steps: Mapping[int, int]) -> int:
    """The learner step the lease budget counts from for an actor serving `version`: the step at which
    that version was published, at most the learner's own. An actor still sampling with older weights
    gets the budget of its own version (AReaL, too, bounds by the rollout's version), so what it
    leases is trained on before it falls more than max_staleness versions behind. A version this
    learner did not publish (served before a restore) counts as the oldest one it did; before any
    publish, the learner's step. `version_steps` maps each published version to the step then, in
    publish order."""
    if not version_steps:
        return learner_step
    oldest = next(iter(version_steps.values()))
    return min(version_steps.get(version, oldest), learner_step)


def may_lease(ask: LeaseAsk) -> bool:
    """Whether the actor may lease at all. Asynchronous (η > 0), what an actor η versions behind
    samples would be stale by the time it arrives; synchronous (η = 0), the step waits for exactly
    those groups. An actor at the bound that refused the newest version (its transfer or check
    failed) may lease too: told to load newer weights first, it would wait for a version that needs
    its groups to be trained, and a run whose every actor refused one version would stall. What it
    samples is fresh until the learner's next step: a step waiting for groups trains it; overtaken by a
    peer's newer groups, it is dropped as stale and its prompt leased again (or the step holds for it,
    `rollout.late_group_wait_s`, learner/service/late_groups.py)."""
    bound = ask.learner_step - ask.max_staleness
    return (ask.max_staleness == 0 or ask.budget_step > bound
            or (ask.refused_newest and ask.budget_step == bound))


def decide_lease(ask: LeaseAsk, outcome: LeaseOutcome) -> LeaseDecision:
    """The table of the module docstring."""
    if outcome.granted >= ask.wanted:
        return LeaseDecision(Pace.GRANTED, 0.0)
    if outcome.exhausted:
        return LeaseDecision(Pace.EXHAUSTED, 0.0)
    if not may_lease(ask):
        return LeaseDecision(Pace.OUT_OF_BOUND, RETRY_MIN_S)
    if outcome.allowance != 0:
        return LeaseDecision(Pace.DRY, 0.0)
    if ask.budget_step < ask.learner_step and outcome.allowance_now != 0:
        return LeaseDecision(Pace.LAGGING, RETRY_MIN_S)
    return LeaseDecision(Pace.WAIT_STEP, outcome.step_due_in_s)

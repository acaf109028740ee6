"""The pacing table (learner/service/pacing.py) without gRPC: each row of `decide_lease` with its retry
hint, who may lease at all (`may_lease`, at and around the bound), the budget step an actor's version
gives (`budget_step`), and the whole table against the rule as it stood inline in LeasePrompts."""

from __future__ import annotations

import itertools

import pytest

from learner.service.lease_budget import RETRY_MIN_S
from learner.service.pacing import (
    LeaseAsk,
    LeaseDecision,
    LeaseOutcome,
    Pace,
    budget_step,
    decide_lease,
    may_lease,
)

DUE = 0.7  # StepPace's hint in these cases: distinct from 0 and from RETRY_MIN_S

ASK = LeaseAsk(wanted=8, learner_step=5, budget_step=5, max_staleness=2)  # in bound, on the newest version
LAGGING = LeaseAsk(wanted=8, learner_step=5, budget_step=4, max_staleness=2)  # one version behind: 4 > 5 - 2
BEHIND = LeaseAsk(wanted=8, learner_step=5, budget_step=3, max_staleness=2)  # η versions behind: 3 <= 5 - 2


def outcome(granted: int = 8, exhausted: bool = False, allowance: int | None = 0,
            allowance_now: int | None = 0) -> LeaseOutcome:
    return LeaseOutcome(granted, exhausted, allowance, allowance_now, step_due_in_s=DUE)


# (row, ask, outcome, pace, retry_after_s): one case per row of the table, in its order
ROWS = {
    "got what it asked for": (ASK, outcome(granted=8), Pace.GRANTED, 0.0),
    "source exhausted": (ASK, outcome(granted=3, exhausted=True), Pace.EXHAUSTED, 0.0),
    "out of bound": (BEHIND, outcome(granted=0, allowance=4, allowance_now=4), Pace.OUT_OF_BOUND, RETRY_MIN_S),
    "slots left, the source ran dry": (ASK, outcome(granted=3, allowance=5), Pace.DRY, 0.0),
    "lagging: its version's slots spent, the newest's not": (LAGGING, outcome(granted=3, allowance_now=4),
                                                             Pace.LAGGING, RETRY_MIN_S),
    "slots spent: wait for the next step": (ASK, outcome(granted=3), Pace.WAIT_STEP, DUE),
}


@pytest.mark.parametrize("row", ROWS)
def test_each_row_of_the_table(row):
    ask, got, pace, retry_after_s = ROWS[row]
    assert decide_lease(ask, got) == LeaseDecision(pace, retry_after_s)


# edge cases, each with the row that must decide it
EDGES = {
    "asked for none": (LeaseAsk(0, 5, 5, 2), outcome(granted=0), Pace.GRANTED, 0.0),
    "asked for none while out of bound": (LeaseAsk(0, 5, 3, 2), outcome(granted=0), Pace.GRANTED, 0.0),
    "all granted with the budget just spent": (ASK, outcome(granted=8, allowance=0), Pace.GRANTED, 0.0),
    "all granted from an exhausted source": (ASK, outcome(granted=8, exhausted=True), Pace.GRANTED, 0.0),
    "out of bound and exhausted: no hint": (BEHIND, outcome(granted=0, exhausted=True), Pace.EXHAUSTED, 0.0),
    "out of bound, whatever the budget says": (BEHIND, outcome(granted=0, allowance=None, allowance_now=None),
                                               Pace.OUT_OF_BOUND, RETRY_MIN_S),
    "zero budget left, nothing granted": (ASK, outcome(granted=0), Pace.WAIT_STEP, DUE),
    "unbounded budget (B = 0), the source ran dry": (ASK, outcome(granted=2, allowance=None, allowance_now=None),
                                                     Pace.DRY, 0.0),
    "lagging, but the newest version's slots are spent too": (LAGGING, outcome(granted=0), Pace.WAIT_STEP, DUE),
    "on the newest version, slots left at t do not count": (ASK, outcome(granted=0, allowance_now=4),
                                                            Pace.WAIT_STEP, DUE),
    "synchronous (η = 0) far behind is in bound, slots spent": (LeaseAsk(4, 5, 0, 0), outcome(granted=0,
                                                                allowance_now=4), Pace.LAGGING, RETRY_MIN_S),
}


@pytest.mark.parametrize("edge", EDGES)
def test_edge_cases(edge):
    ask, got, pace, retry_after_s = EDGES[edge]
    assert decide_lease(ask, got) == LeaseDecision(pace, retry_after_s)


@pytest.mark.parametrize(("learner_step", "step", "eta", "allowed"), [
    (5, 5, 2, True),  # on the newest version
    (5, 4, 2, True),  # one behind: 4 > 5 - 2
    (5, 3, 2, False),  # at the bound: 3 <= 5 - 2, what it samples would arrive stale
    (5, 0, 2, False),  # far behind
    (1, 0, 1, False),  # η = 1: one version behind is already out
    (1, 1, 1, True),
    (5, 0, 0, True),  # synchronous: the step waits for exactly those groups
    (0, 0, 3, True),  # before any step
])
def test_who_may_lease(learner_step, step, eta, allowed):
    assert may_lease(LeaseAsk(4, learner_step, step, eta)) is allowed


@pytest.mark.parametrize(("learner_step", "step", "eta", "allowed"), [
    (5, 3, 2, True),  # at the bound: it cannot load newer weights, and what it samples is fresh until step 6
    (1, 0, 1, True),  # η = 1, one version behind
    (5, 2, 2, False),  # past the bound: stale even now
    (5, 4, 2, True),  # in bound anyway
])
def test_an_actor_that_refused_the_newest_version_may_lease_at_the_bound(learner_step, step, eta, allowed):
    assert may_lease(LeaseAsk(4, learner_step, step, eta, refused_newest=True)) is allowed


VERSION_STEPS = {3: 0, 4: 2, 7: 5}  # version -> the learner's step when it was published, in publish order


@pytest.mark.parametrize(("learner_step", "version", "version_steps", "step"), [
    (6, 7, VERSION_STEPS, 5),  # the step its version was published at
    (6, 4, VERSION_STEPS, 2),  # an older version: its own, older budget
    (6, 9, VERSION_STEPS, 0),  # a version this learner never published: the oldest it did
    (6, 1, VERSION_STEPS, 0),  # served before a restore: the oldest too
    (4, 7, VERSION_STEPS, 4),  # never past the learner's own step (a restored learner at an earlier step)
    (3, 0, {}, 3),  # nothing published yet: the learner's step
])
def test_the_budget_step_of_an_actor_is_that_of_its_version(learner_step, version, version_steps, step):
    assert budget_step(learner_step, version, version_steps) == step


def _inline_rule(ask: LeaseAsk, got: LeaseOutcome) -> float:
    """The retry hint as LearnerService.LeasePrompts computed it inline before pacing.py (kept as the
    oracle of the test below, with the same names)."""
    step, eta = ask.budget_step, ask.max_staleness
    doomed = eta > 0 and step <= ask.learner_step - eta
    held_back = got.granted < ask.wanted and (doomed or got.allowance == 0)
    retry_after = 0.0
    if held_back and not got.exhausted:
        lagging = doomed or step < ask.learner_step and got.allowance_now != 0
        retry_after = RETRY_MIN_S if lagging else got.step_due_in_s
    return retry_after


def test_the_table_gives_the_hint_the_inline_rule_gave_in_every_case():
    cases = 0
    for wanted, learner_step, eta, exhausted, allowance, allowance_now in itertools.product(
            (0, 1, 4), (0, 1, 3), (0, 1, 2), (False, True), (None, 0, 2), (None, 0, 2)):
        for step in range(learner_step + 1):
            ask = LeaseAsk(wanted, learner_step, step, eta)
            for granted in range(wanted + 1) if may_lease(ask) else (0,):
                got = LeaseOutcome(granted, exhausted, allowance, allowance_now, step_due_in_s=DUE)
                assert decide_lease(ask, got).retry_after_s == _inline_rule(ask, got), (ask, got)
                cases += 1
    assert cases == 2484  # none skipped

"""The lease budget (learner/service/lease_budget.py) on a PromptSource with a fake clock, no gRPC: at most
(η + s + 1)·B prompts in use whatever actors do (hold leases, die, re-lease, get rejected or dropped),
slots given back by drops and rejections, free re-issues of expired leases, exact restore."""

from __future__ import annotations

import json

import numpy as np
import pytest
from wire_helpers import FakeClock

from learner.service.lease_budget import RETRY_MAX_S, RETRY_MIN_S, LeaseBudget, StepPace
from learner.service.prompt_source import Prompt, PromptSource, PromptState

LEASE_S = 5.0


def _rows(n: int) -> list[Prompt]:
    return [Prompt([1, 2, i], str(i)) for i in range(n)]


def _source(n: int, prompts_per_step: int, max_staleness: int, clock: FakeClock | None = None) -> PromptSource:
    source = PromptSource(_rows(n), epochs=None, clock=clock or FakeClock())
    source.limit_leases(prompts_per_step, max_staleness)
    return source


def _keys(source: PromptSource, actor: str, n: int, step: int) -> list[str]:
    return [p.group_id for p in source.lease(actor, n, LEASE_S, step)]


def test_the_formula_and_its_arithmetic():
    budget = LeaseBudget(prompts_per_step=4, max_staleness=2)
    assert [budget.limit(s) for s in (0, 1, 5)] == [12, 16, 32]
    budget.take(12)
    assert budget.allowance(0) == 0 and budget.allowance(1) == 4
    budget.give_back(3)
    assert (budget.in_use, budget.allowance(0)) == (9, 3)
    with pytest.raises(ValueError):
        budget.give_back(10)
    assert LeaseBudget().allowance(10**6) is None and LeaseBudget().limit(3) is None  # B = 0: unbounded
    with pytest.raises(ValueError):
        LeaseBudget(prompts_per_step=-1)


def test_an_actor_asking_for_more_gets_the_allowance_and_more_after_each_step():
    source = _source(100, prompts_per_step=4, max_staleness=1)
    assert len(_keys(source, "a", 20, step=0)) == 8  # (1 + 0 + 1)·4
    assert _keys(source, "b", 20, step=0) == [] and source.allowance(0) == 0
    assert len(_keys(source, "b", 20, step=1)) == 4
    assert len(_keys(source, "a", 3, step=3)) == 3 and source.allowance(3) == 5
    assert source.counts()["lease_slots_in_use"] == 15


def test_sync_mode_leases_exactly_b_per_step():
    source = _source(100, prompts_per_step=4, max_staleness=0)
    for step in range(5):
        batch = _keys(source, "a", 10, step)
        assert len(batch) == 4 and _keys(source, "a", 10, step) == []
        for key in batch:
            source.hold(key)
            source.retire(key)  # trained on
    assert source.counts()["lease_slots_in_use"] == 20


def test_drops_rejections_and_untrained_groups_give_their_slot_back_and_trained_ones_keep_it():
    source = _source(100, prompts_per_step=2, max_staleness=1)
    a, b, c, d = _keys(source, "x", 4, step=0)
    assert source.allowance(0) == 0
    source.release(a, holder="x")  # stale on arrival
    source.hold(b)
    source.release(b)  # stale at dequeue
    source.retire(c, trained=False)  # prompt_too_long, or retired for lack of signal
    source.hold(d)
    source.retire(d)  # trained on: the slot stays used
    assert source.allowance(0) == 3 and source.counts()["lease_slots_in_use"] == 1
    again = _keys(source, "y", 10, step=0)
    assert set(again) >= {a, b} and len(again) == 3  # the dropped prompts come back first, within budget
    source.release(a, holder="x")  # a late copy from the old holder gives nothing back twice
    assert source.allowance(0) == 0


def test_a_dead_actors_expired_leases_are_reissued_without_budget_even_when_it_is_spent():
    clock = FakeClock()
    source = _source(100, prompts_per_step=3, max_staleness=0, clock=clock)
    held = _keys(source, "dead", 5, step=0)
    assert len(held) == 3 and _keys(source, "alive", 5, step=0) == []
    clock.now = LEASE_S + 1  # the actor died holding them: the leases expire
    assert sorted(_keys(source, "alive", 5, step=0)) == sorted(held)
    counts = source.counts()
    assert (counts["prompts_leased"], counts["prompts_reissued"], counts["lease_slots_in_use"]) == (6, 3, 3)


def test_a_late_copy_queued_for_a_dropped_prompt_holds_a_slot_again():
    clock = FakeClock()
    source = _source(100, prompts_per_step=1, max_staleness=0, clock=clock)
    (key,) = _keys(source, "a", 1, step=0)
    clock.now = LEASE_S + 1
    assert _keys(source, "b", 1, step=0) == [key]  # re-issued: "a" is an earlier holder now
    source.release(key, holder="b")  # b's group was stale: its slot goes back
    assert source.counts()["lease_slots_in_use"] == 0
    source.hold(key)  # a's late copy was fresh and is queued
    assert source.counts()["lease_slots_in_use"] == 1 and source.state(key) is PromptState.HELD


def test_a_restored_source_has_the_slots_in_use_it_had_and_neither_over_issues_nor_deadlocks():
    clock = FakeClock()
    source = _source(100, prompts_per_step=2, max_staleness=1, clock=clock)
    trained, queued, dropped, leased = (_keys(source, "a", 1, step=0) for _ in range(4))
    source.hold(trained[0])
    source.retire(trained[0])
    source.hold(queued[0])
    source.release(dropped[0], holder="a")
    assert source.counts()["lease_slots_in_use"] == 3 and source.allowance(0) == 1
    state = json.loads(json.dumps(source.state_dict()))

    restored = _source(100, prompts_per_step=2, max_staleness=1, clock=clock)
    restored.load_state_dict(state, lease_seconds=LEASE_S)
    # the queued group is forgotten (its actor sends it again): its prompt is outstanding with its slot
    assert restored.counts()["lease_slots_in_use"] == 3 and restored.allowance(0) == 1
    assert _keys(restored, "b", 5, step=0) == dropped  # the dropped prompt takes the last slot
    assert _keys(restored, "b", 5, step=0) == []
    clock.now += LEASE_S + 1  # nobody answers: the restored leases expire and are re-issued for free
    assert sorted(_keys(restored, "c", 5, step=0)) == sorted(queued + dropped + leased)


@pytest.mark.parametrize("max_staleness", [0, 1, 3])
def test_the_bound_holds_under_random_actors_that_die_release_and_get_rejected(max_staleness):
    """A seeded random run of 4 actors and a learner over a fake clock. After every event the slots
    in use equal the independent count (trained + outstanding - outstanding without a slot) and never
    exceed (η + s + 1)·B plus the late copies queued for dropped prompts; a lease never takes a slot
    past the limit; and the learner keeps stepping (no deadlock)."""
    b, steps_wanted = 4, 40
    rng = np.random.default_rng(max_staleness)
    clock = FakeClock()
    source = _source(50, prompts_per_step=b, max_staleness=max_staleness, clock=clock)
    actors = {f"actor-{i}": [] for i in range(4)}  # actor -> keys it holds (and will answer)
    queue: list[str] = []
    step = trained = late_holds = 0
    without_slot: set[str] = set()
    for _ in range(20_000):
        if step == steps_wanted:
            break
        event = rng.choice(["lease", "answer", "answer", "die", "tick", "learn"])
        actor = str(rng.choice(list(actors)))
        if event == "lease":
            before = source.counts()["lease_slots_in_use"]
            got = _keys(source, actor, int(rng.integers(1, 9)), step)
            after = source.counts()["lease_slots_in_use"]
            assert after <= max(before, source_limit(b, max_staleness, step))
            without_slot -= set(got)
            actors[actor] += got
        elif event == "answer" and actors[actor]:
            key = actors[actor].pop(int(rng.integers(len(actors[actor]))))
            info = source.lease_info(key)
            if info is None or source.state(key) is not PromptState.OUTSTANDING:
                continue  # a duplicate: already queued or retired
            fate = rng.choice(["queue", "queue", "queue", "stale", "too_long", "invalid"])
            if fate == "queue":
                late_holds += key in without_slot
                without_slot.discard(key)
                source.hold(key)
                queue.append(key)
            elif fate == "stale" and info.holder == actor:
                source.release(key, holder=actor)
                without_slot.add(key)
            elif fate == "too_long":
                source.retire(key, trained=False)
                without_slot.discard(key)
        elif event == "die":
            actors[actor] = []  # its leases expire; a restarted actor of the same id holds nothing
        elif event == "tick":
            clock.now += float(rng.uniform(0.5, 3.0))
        elif event == "learn" and len(queue) >= b:
            batch, queue[:] = queue[:b], queue[b:]
            for key in batch:
                fate = rng.choice(["trained", "trained", "trained", "zero_signal", "stale"])
                if fate == "stale":
                    source.release(key)
                    without_slot.add(key)
                else:
                    source.retire(key, trained=fate == "trained")
                    trained += fate == "trained"
            step += 1
        counts = source.counts()
        assert counts["lease_slots_in_use"] == trained + counts["prompts_outstanding"] - len(without_slot)
        assert counts["lease_slots_in_use"] <= source_limit(b, max_staleness, step) + late_holds
    assert step == steps_wanted, f"the learner stalled at step {step}: {source.counts()}"


def source_limit(prompts_per_step: int, max_staleness: int, step: int) -> int:
    """(η + s + 1)·B, written out again here rather than taken from the code under test."""
    return (max_staleness + step + 1) * prompts_per_step


def test_the_retry_hint_follows_the_learners_step_pace():
    pace = StepPace(now=100.0)
    assert pace.retry_after(100.0) == RETRY_MIN_S  # nothing known yet: the wait doubles from the minimum
    assert pace.retry_after(100.4) == pytest.approx(0.4)
    assert pace.retry_after(130.0) == RETRY_MAX_S
    for now in (101.0, 102.0, 103.0):  # one step a second
        pace.stepped(now)
    assert pace.retry_after(103.3) == pytest.approx(0.7)  # the next step is due in 0.7 s
    assert pace.retry_after(103.9) == pytest.approx(0.25)  # due soon: a quarter interval, never a spin
    assert pace.retry_after(110.0) == pytest.approx(0.25)  # overdue: polled four times a step interval


def test_late_leases_are_the_unanswered_unexpired_ones_granted_at_or_before_a_step():
    clock = FakeClock()
    source = _source(100, prompts_per_step=2, max_staleness=1, clock=clock)
    old = _keys(source, "slow", 2, step=0)
    clock.now += 1.0
    _keys(source, "fast", 2, step=1)
    assert source.late_leases(through_step=0) == (2, LEASE_S - 1.0)
    assert source.late_leases(through_step=-1) == (0, float("inf"))
    source.hold(old[0])  # its group is queued
    assert source.late_leases(0) == (1, LEASE_S - 1.0)
    source.release(old[1])  # dropped: re-issued at the next lease, nobody is sampling it
    assert source.late_leases(0)[0] == 0
    assert source.late_leases(1) == (2, LEASE_S)  # the fast actor's, leased a second later
    assert source.late_leases(1, moved_on={"fast"}) == (0, float("inf"))  # it loaded newer weights since
    clock.now += LEASE_S
    assert source.late_leases(1)[0] == 0  # expired: its actor is gone, waiting would not bring it

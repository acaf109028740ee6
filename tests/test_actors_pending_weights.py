"""PendingWeights, the actor's weight swap as plain state (actors/weights/pending.py): every transition
of its diagram, superseding offers, the drain deadline, force, rejections and idempotence. No engine."""

from __future__ import annotations

import math

from actors.weights.pending import Due, PendingWeights


def draining(version: int = 1, drain_steps: int = 2) -> PendingWeights[str]:
    """Serving 0, `version` offered while 3 groups are in flight."""
    swap: PendingWeights[str] = PendingWeights(0, drain_steps)
    swap.offer(version, f"w{version}", in_flight=3)
    return swap


def steps_until_due(swap: PendingWeights[str], in_flight: int = 3, limit: int = 100) -> int:
    """How many engine steps with `in_flight` groups left it takes until the pending version is due."""
    for step in range(1, limit + 1):
        swap.stepped(in_flight)
        if swap.due() is not None:
            return step
    raise AssertionError(f"not due after {limit} steps")


# ------------------------------------------------------------------ SERVING


def test_serving_has_nothing_pending_and_wants_any_other_version():
    swap: PendingWeights[str] = PendingWeights(0, 2)
    assert swap.served == 0 and swap.pending_version is None and swap.due() is None
    assert not swap.wants(0, now=0.0)
    assert swap.wants(1, now=0.0) and swap.wants(7, now=0.0)


def test_stepped_and_force_while_serving_change_nothing():
    swap: PendingWeights[str] = PendingWeights(3, 2)
    swap.stepped(0)
    swap.stepped(5)
    swap.force()
    assert swap.served == 3 and swap.pending_version is None and swap.due() is None


# ------------------------------------------------------------------ SERVING -> DUE -> SERVING


def test_an_offer_to_an_idle_engine_is_due_at_once_and_loaded_serves_it():
    swap: PendingWeights[str] = PendingWeights(0, 2)
    swap.offer(1, "w1", in_flight=0)
    assert swap.due() == Due(1, "w1") and swap.pending_version == 1 and swap.served == 0
    swap.loaded(1)
    assert swap.served == 1 and swap.pending_version is None and swap.due() is None
    assert not swap.wants(1, now=0.0) and swap.wants(0, now=0.0)


# ------------------------------------------------------------------ SERVING -> DRAINING


def test_an_offer_to_a_busy_engine_drains_and_is_not_fetched_again():
    swap = draining(1)
    assert swap.pending_version == 1 and swap.due() is None and swap.served == 0
    assert not swap.wants(1, now=0.0)  # pending
    assert swap.wants(2, now=0.0)


# ------------------------------------------------------------------ DRAINING -> DRAINING / DUE


def test_each_step_with_groups_left_spends_one_drain_step_and_the_next_is_the_deadline():
    swap = draining(1, drain_steps=2)
    swap.stepped(3)
    assert swap.due() is None
    swap.stepped(2)
    assert swap.due() is None
    swap.stepped(1)  # no drain step left: forced in, the group still running is aborted
    assert swap.due() == Due(1, "w1")


def test_the_deadline_is_drain_steps_plus_one_engine_steps():
    for drain_steps in (0, 1, 5, 64):
        assert steps_until_due(draining(1, drain_steps)) == drain_steps + 1


def test_with_no_drain_steps_the_first_step_makes_it_due():
    swap = draining(1, drain_steps=0)
    assert swap.due() is None  # offered busy: not due before an engine step
    swap.stepped(3)
    assert swap.due() == Due(1, "w1")


def test_a_drained_engine_makes_it_due_with_drain_steps_left():
    swap = draining(1, drain_steps=64)
    swap.stepped(2)
    assert swap.due() is None
    swap.stepped(0)
    assert swap.due() == Due(1, "w1")


def test_force_makes_a_draining_version_due_at_once():
    swap = draining(1, drain_steps=64)
    swap.force()
    assert swap.due() == Due(1, "w1")


# ------------------------------------------------------------------ DUE


def test_stepped_and_force_leave_a_due_version_due():
    swap = draining(1, drain_steps=0)
    swap.stepped(3)
    swap.stepped(3)
    swap.stepped(0)
    swap.force()
    assert swap.due() == Due(1, "w1") and swap.served == 0


def test_loaded_after_a_drain_serves_the_version():
    swap = draining(4, drain_steps=1)
    swap.stepped(0)
    swap.loaded(4)
    assert swap.served == 4 and swap.pending_version is None and swap.due() is None
    swap.stepped(0)
    swap.force()
    assert swap.due() is None  # nothing left to load


# ------------------------------------------------------------------ superseding


def test_a_newer_offer_supersedes_a_draining_one_and_drains_afresh():
    swap = draining(1, drain_steps=3)
    swap.stepped(3)
    swap.stepped(3)  # one drain step left for version 1
    swap.offer(2, "w2", in_flight=3)
    assert swap.pending_version == 2 and swap.due() is None
    assert steps_until_due(swap) == 4  # its own 3 drain steps, then the deadline
    assert swap.due() == Due(2, "w2")
    swap.loaded(2)
    assert swap.served == 2 and swap.pending_version is None


def test_a_newer_offer_supersedes_a_due_one():
    swap = draining(1)
    swap.force()
    swap.offer(2, "w2", in_flight=3)
    assert swap.pending_version == 2 and swap.due() is None  # busy engine: drains again
    swap.offer(3, "w3", in_flight=0)
    assert swap.due() == Due(3, "w3")


def test_the_superseded_version_is_wanted_again_only_if_the_learner_names_it():
    swap = draining(1)
    swap.offer(2, "w2", in_flight=3)
    assert swap.wants(1, now=0.0) and not swap.wants(2, now=0.0)


def test_an_offer_of_a_lower_number_supersedes_too_the_learner_went_back_to_a_checkpoint():
    """Offers come one at a time, each the learner's newest: a lower number means the learner
    restarted from a checkpoint older than the pending version, which it will never publish again
    (a group sampled with it would be refused as from the future), so the last offer wins."""
    swap: PendingWeights[str] = PendingWeights(4, 8)
    swap.offer(6, "w6", in_flight=2)
    swap.offer(5, "w5", in_flight=2)
    assert swap.pending_version == 5
    swap.stepped(0)
    assert swap.due() == Due(5, "w5")


def test_offering_the_pending_version_again_replaces_its_weights_and_restarts_the_drain():
    """A restarted learner may publish a version number again with other weights: the fetched ones win."""
    swap = draining(1, drain_steps=2)
    swap.stepped(3)
    swap.offer(1, "w1-again", in_flight=3)
    assert steps_until_due(swap) == 3
    assert swap.due() == Due(1, "w1-again")


# ------------------------------------------------------------------ rejections


def test_a_rejected_version_is_not_wanted_until_its_retry_time():
    swap: PendingWeights[str] = PendingWeights(0, 2)
    swap.reject(3, now=10.0, retry_after_s=5.0)
    assert not swap.wants(3, now=10.0) and not swap.wants(3, now=14.999)
    assert swap.wants(3, now=15.0)
    assert swap.wants(4, now=10.0)  # only that version


def test_a_version_rejected_for_good_is_never_wanted_again():
    swap: PendingWeights[str] = PendingWeights(0, 2)
    swap.reject(3, now=10.0, retry_after_s=math.inf)
    assert not swap.wants(3, now=1e12)


def test_rejecting_again_moves_the_retry_time():
    swap: PendingWeights[str] = PendingWeights(0, 2)
    swap.reject(3, now=10.0, retry_after_s=5.0)
    swap.reject(3, now=15.0, retry_after_s=5.0)  # retried at 15 and failed again
    assert not swap.wants(3, now=19.0) and swap.wants(3, now=20.0)


def test_a_rejection_leaves_the_pending_version_and_its_drain_alone():
    swap = draining(1, drain_steps=2)
    swap.stepped(3)
    swap.reject(2, now=0.0, retry_after_s=1.0)  # a newer version failed its transfer
    assert swap.pending_version == 1 and swap.due() is None
    assert steps_until_due(swap) == 2  # the one drain step left, then the deadline
    assert swap.due() == Due(1, "w1")


def test_a_rejected_version_is_still_unwanted_while_served_or_pending_after_its_retry_time():
    swap: PendingWeights[str] = PendingWeights(0, 2)
    swap.reject(1, now=0.0, retry_after_s=1.0)
    swap.offer(1, "w1", in_flight=3)  # retried and fetched
    assert not swap.wants(1, now=5.0)
    swap.force()
    swap.loaded(1)
    assert not swap.wants(1, now=5.0)


# ------------------------------------------------------------------ idempotence


def test_due_is_a_query():
    swap = draining(1)
    swap.force()
    assert swap.due() == swap.due() == Due(1, "w1")
    assert swap.pending_version == 1 and swap.served == 0


def test_force_twice_is_force_once():
    once, twice = draining(1), draining(1)
    once.force()
    twice.force()
    twice.force()
    assert once.due() == twice.due() == Due(1, "w1")


def test_loaded_twice_is_loaded_once():
    swap = draining(1)
    swap.force()
    swap.loaded(1)
    swap.loaded(1)
    assert swap.served == 1 and swap.pending_version is None and swap.due() is None


def test_loaded_of_another_version_records_it_and_keeps_the_pending_one():
    swap = draining(2)
    swap.loaded(1)
    assert swap.served == 1 and swap.pending_version == 2 and swap.due() is None

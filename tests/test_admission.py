"""The admission table (learner/service/admission.py) without gRPC: each row of the table with its ack status,
detail, counters and effect, the checks `examine` makes before it, and who may answer a lease."""

from __future__ import annotations

import pytest
from wire_helpers import make_group

from actors.learner_client import Prompt
from learner.service.accounting import COUNTERS
from learner.service.admission import (
    OUTCOME_COUNTERS,
    RESTARTED_DETAIL,
    Decision,
    Effect,
    PromptFacts,
    Rules,
    Sender,
    decide,
    examine,
    internal_error,
    may_answer,
    prompt_limit,
)
from learner.service.group_validation import GroupLimits, GroupRecord
from learner.service.prompt_source import LeaseInfo, PromptState
from learner.service.tolerant_handlers import Undecodable
from tandem_wire import pb

PROMPT = [5, 6, 7, 8, 9]
LEASE = Prompt(PROMPT, "p", {"answer": "3"}, group_id="0:3")
ME = Sender("actor-a", "actor-a#1", max_model_len=128)
LIMITS = GroupLimits(latest_version=3, group_size=4, vocab_size=64)
RULES = Rules(LIMITS, max_staleness=1)
MINE = PromptFacts(PromptState.OUTSTANDING, PROMPT, LeaseInfo("actor-a#1", ()))


def record(policy_version: int = 3, **fields) -> GroupRecord:
    """A validated group of LEASE from ME; completion 0 is unscorable."""
    msg = make_group(LEASE, ME.actor_id, policy_version=policy_version)
    for name, value in fields.items():
        setattr(msg, name, value)
    if msg.rejected_reason:
        msg.ClearField("completions")
    outcome = examine(msg, ME, LIMITS)
    assert isinstance(outcome, GroupRecord), outcome
    return outcome


def counted(status: int, **extra: int) -> dict[str, int]:
    return {"groups_received": 1, OUTCOME_COUNTERS[status]: 1, **extra}


# (row, decide() arguments, status, detail, counters, effect)
ROWS = {
    "queued": (dict(), pb.ACK_STATUS_QUEUED, "",
               counted(pb.ACK_STATUS_QUEUED, completions_unscorable=1), Effect.QUEUE),
    "retired prompt": (dict(prompt=PromptFacts(PromptState.RETIRED)), pb.ACK_STATUS_DUPLICATE, "already consumed",
                       counted(pb.ACK_STATUS_DUPLICATE), Effect.NONE),
    "held prompt": (dict(prompt=PromptFacts(PromptState.HELD)), pb.ACK_STATUS_DUPLICATE, "already queued",
                    counted(pb.ACK_STATUS_DUPLICATE), Effect.NONE),
    "unissued and stale (restarted learner)": (
        dict(prompt=PromptFacts(PromptState.UNISSUED), record=record(policy_version=1)), pb.ACK_STATUS_STALE,
        RESTARTED_DETAIL, counted(pb.ACK_STATUS_STALE), Effect.NONE),
    "unissued and fresh": (dict(prompt=PromptFacts(PromptState.UNISSUED)), pb.ACK_STATUS_INVALID,
                           "group_id was never leased by this learner", counted(pb.ACK_STATUS_INVALID), Effect.NONE),
    "unknown prompt": (dict(prompt=PromptFacts(PromptState.UNKNOWN)), pb.ACK_STATUS_INVALID,
                       "group_id was never leased by this learner", counted(pb.ACK_STATUS_INVALID), Effect.NONE),
    "leased to another actor": (
        dict(prompt=PromptFacts(PromptState.OUTSTANDING, PROMPT, LeaseInfo("actor-b#2", ()))), pb.ACK_STATUS_INVALID,
        "prompt 0:3 is leased to another actor", counted(pb.ACK_STATUS_INVALID, lease_violations=1), Effect.NONE),
    "rejection by another actor": (
        dict(prompt=PromptFacts(PromptState.OUTSTANDING, PROMPT, LeaseInfo("actor-b#2", ())),
             record=record(rejected_reason="prompt_too_long")), pb.ACK_STATUS_INVALID,
        "prompt 0:3 is leased to another actor", counted(pb.ACK_STATUS_INVALID, lease_violations=1), Effect.NONE),
    "rejection of a prompt within the declared limit": (
        dict(sender=Sender("actor-a", "actor-a#1", 128, max_prompt_tokens=5),
             record=record(rejected_reason="prompt_too_long")), pb.ACK_STATUS_INVALID,
        "prompt_too_long refused: the prompt has 5 tokens, within the limit 5", counted(pb.ACK_STATUS_INVALID),
        Effect.NONE),
    "rejection of a prompt past the declared limit": (
        dict(sender=Sender("actor-a", "actor-a#1", 128, max_prompt_tokens=4),
             record=record(rejected_reason="prompt_too_long")), pb.ACK_STATUS_CONSUMED,
        "prompt retired: prompt_too_long", counted(pb.ACK_STATUS_CONSUMED), Effect.RETIRE),
    "prompt tokens differ from the lease": (
        dict(prompt=PromptFacts(PromptState.OUTSTANDING, [5, 6, 7, 8, 10], LeaseInfo("actor-a#1", ()))),
        pb.ACK_STATUS_INVALID, "prompt_token_ids differ from the leased prompt", counted(pb.ACK_STATUS_INVALID),
        Effect.NONE),
    "stale on arrival": (dict(record=record(policy_version=1)), pb.ACK_STATUS_STALE,
                         "policy_version 1 is more than 1 behind 3", counted(pb.ACK_STATUS_STALE), Effect.RELEASE),
    "queue full": (dict(queue_full=True), pb.ACK_STATUS_RETRY, "queue full", counted(pb.ACK_STATUS_RETRY),
                   Effect.NONE),
}


@pytest.mark.parametrize("row", ROWS)
def test_each_row_of_the_table(row):
    arguments, status, detail, counters, effect = ROWS[row]
    arguments = {"record": record(), "sender": ME, "prompt": MINE, "rules": RULES, "queue_full": False,
                 **arguments}
    decision = decide(**arguments)
    assert (decision.status, decision.detail, dict(decision.counters), decision.effect) == (
        status, detail, counters, effect)
    assert (decision.record is not None) == (effect is Effect.QUEUE)


def test_every_status_and_every_counter_the_table_changes_is_covered():
    decisions = [decide(**{"record": record(), "sender": ME, "prompt": MINE, "rules": RULES, "queue_full": False,
                           **row[0]}) for row in ROWS.values()]
    decisions.append(internal_error(ValueError("boom")))
    statuses = {d.status for d in decisions}
    assert statuses == set(OUTCOME_COUNTERS)  # every ack status the table can answer
    touched = {name for d in decisions for name in d.counters}
    assert touched == {"groups_received", *OUTCOME_COUNTERS.values(), "completions_unscorable",
                       "lease_violations", "internal_errors"}
    assert touched <= set(COUNTERS)
    for d in decisions:  # the balance: each group is received once and has exactly one outcome
        outcomes = [name for name in OUTCOME_COUNTERS.values() if d.counters.get(name)]
        assert d.counters["groups_received"] == 1 and len(outcomes) == 1


def test_the_late_copy_of_an_earlier_holder_and_a_restored_lease_may_answer():
    assert may_answer(LeaseInfo("actor-b#2", ("actor-a#1",)), "actor-a#1")  # lease expired, re-issued to b
    assert may_answer(LeaseInfo("", ()), "anyone#9")  # restored from a checkpoint: holder unknown
    assert not may_answer(LeaseInfo("actor-b#2", ("actor-c#3",)), "actor-a#1")
    assert not may_answer(LeaseInfo("actor-a#1", ()), "actor-a#4")  # a new incarnation of the same id
    late = PromptFacts(PromptState.OUTSTANDING, PROMPT, LeaseInfo("actor-b#2", ("actor-a#1",)))
    assert decide(record(), ME, late, RULES, queue_full=False).status == pb.ACK_STATUS_QUEUED


@pytest.mark.parametrize("sender_limit, run_limit, max_model_len, expected", [
    (0, 0, 128, None),  # nothing declared: a holder's rejection cannot be checked
    (0, 16, 128, 16),  # the run's limit
    (8, 16, 128, 8),  # the actor's declared limit wins
    (0, 16, 10, 9),  # capped by what fits the actor's max_model_len
    (0, 16, 0, 16),
])
def test_the_prompt_limit_a_rejection_is_checked_against(sender_limit, run_limit, max_model_len, expected):
    sender = Sender("a", "a#1", max_model_len=max_model_len, max_prompt_tokens=sender_limit)
    rules = Rules(GroupLimits(latest_version=0, max_prompt_tokens=run_limit), max_staleness=1)
    assert prompt_limit(sender, rules) == expected


def test_a_rejection_that_cannot_be_checked_is_taken_from_the_lease_holder():
    decision = decide(record(rejected_reason="prompt_too_long"), ME, MINE, RULES, queue_full=False)
    assert (decision.status, decision.effect) == (pb.ACK_STATUS_CONSUMED, Effect.RETIRE)


def _invalid(outcome: GroupRecord | Decision) -> str:
    assert isinstance(outcome, Decision) and outcome.status == pb.ACK_STATUS_INVALID
    assert dict(outcome.counters) == counted(pb.ACK_STATUS_INVALID)
    return outcome.detail


def test_examine_refuses_undecodable_invalid_and_foreign_groups():
    assert _invalid(examine(Undecodable("undecodable ScoredGroup: truncated"), ME, LIMITS)) == (
        "undecodable ScoredGroup: truncated")
    group = make_group(LEASE, "actor-b")
    assert _invalid(examine(group, ME, LIMITS)) == "actor_id 'actor-b' is not the stream's actor 'actor-a'"
    group = make_group(LEASE, ME.actor_id)
    group.group_id = "1" * 5000 + ":0"
    assert _invalid(examine(group, ME, LIMITS)) == "group_id has 5002 characters > 128"
    group.group_id, group.actor_id = "0:3", "x" * (1 << 20)
    assert _invalid(examine(group, ME, LIMITS)) == f"actor_id has {1 << 20} characters > 128"
    group.actor_id = "actor-a\n"
    assert "non-printable" in _invalid(examine(group, ME, LIMITS))


def test_an_internal_error_is_an_invalid_ack_counted_as_such():
    decision = internal_error(ValueError("Exceeds the limit (4300 digits) for integer string conversion"))
    assert decision.status == pb.ACK_STATUS_INVALID and decision.detail == "internal error: ValueError"
    assert dict(decision.counters) == counted(pb.ACK_STATUS_INVALID, internal_errors=1)

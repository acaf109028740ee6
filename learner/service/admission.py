"""The admission table: what the learner answers to one scored group, as pure functions.

`examine` turns a decoded message from a known sender into a GroupRecord, or refuses it (bounds,
validation, a group sent in another actor's name). `decide` takes that record, what the learner
knows of its prompt and the run's rules, and returns the ack's status and detail, the counters that
change and the one effect on the learner's state (queue the group, retire or release its prompt).
Neither reads nor changes anything else, so every row of the table is unit-tested without gRPC
(tests/test_admission.py); the servicer applies a Decision's effect and counters together under its
lock, so every snapshot of the counters balances (learner/service/accounting.py).

The rows of `decide`, in order:

    prompt retired                              DUPLICATE  "already consumed"
    prompt held by a queued group               DUPLICATE  "already queued"
    prompt not yet issued, group stale          STALE      (leased by a run this learner restarted over)
    prompt unknown or not yet issued            INVALID    "never leased"
    sender neither holds nor held the lease     INVALID    + lease_violations
    prompt_too_long within the sender's limit   INVALID
    prompt_too_long                             CONSUMED   retire the prompt (prompts_too_long)
    prompt tokens differ from the lease         INVALID
    stale (older than max_staleness versions)   STALE      release the prompt for re-issue
    queue full                                  RETRY
    otherwise                                   QUEUED     queue the group
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

from learner.service.group_queue import is_stale
from learner.service.group_validation import GroupLimits, GroupRecord, parse_group
from learner.service.prompt_source import LeaseInfo, PromptState
from learner.service.tolerant_handlers import Undecodable
from learner.wire_bounds import InvalidInput, shown
from tandem_wire import pb

# The counter each status adds to, besides groups_received (the balance of learner/service/accounting.py).
OUTCOME_COUNTERS = MappingProxyType({
    pb.ACK_STATUS_QUEUED: "groups_queued",
    pb.ACK_STATUS_CONSUMED: "prompts_too_long",
    pb.ACK_STATUS_DUPLICATE: "groups_duplicate",
    pb.ACK_STATUS_STALE: "groups_stale_on_arrival",
    pb.ACK_STATUS_INVALID: "groups_invalid",
    pb.ACK_STATUS_RETRY: "groups_retry",
})
RESTARTED_DETAIL = ("sampled before the learner restarted from an earlier checkpoint; the prompt will be "
                    "issued again")


class Effect(enum.Enum):
    """What the servicer does to its state besides counting and acking."""

    NONE = "none"
    QUEUE = "queue"  # queue the record and hold its prompt
    RETIRE = "retire"  # retire the prompt for good (prompt_too_long)
    RELEASE = "release"  # re-issue the prompt at the next lease (stale on arrival)


@dataclass(frozen=True)
class Sender:
    """Who sent a group, as its credential established: the lease holder key of its registration,
    and the limits it declared."""

    actor_id: str
    holder: str
    max_model_len: int = 0
    max_prompt_tokens: int = 0  # 0 = not declared


@dataclass(frozen=True)
class PromptFacts:
    """What the learner knows of the prompt a group answers."""

    state: PromptState
    prompt_ids: Sequence[int] = ()  # the leased tokens (empty when the row has none, or unknown)
    lease: LeaseInfo | None = None  # for an OUTSTANDING prompt


@dataclass(frozen=True)
class Rules:
    limits: GroupLimits  # including the latest published version
    max_staleness: int


@dataclass(frozen=True)
class Decision:
    status: int  # pb.AckStatus
    detail: str
    counters: Mapping[str, int]
    effect: Effect = Effect.NONE
    record: GroupRecord | None = field(default=None, compare=False)


def answer(status: int, detail: str = "", effect: Effect = Effect.NONE, record: GroupRecord | None = None,
           **extra: int) -> Decision:
    """A decision counted as received, under its status's outcome counter, plus `extra` counters."""
    counters = {"groups_received": 1, OUTCOME_COUNTERS[status]: 1, **extra}
    return Decision(status, detail, counters, effect, record)


def internal_error(error: BaseException) -> Decision:
    """What an unexpected exception while admitting a group becomes: INVALID, counted."""
    return answer(pb.ACK_STATUS_INVALID, f"internal error: {type(error).__name__}", internal_errors=1)


def examine(msg: pb.ScoredGroup | Undecodable, sender: Sender, limits: GroupLimits) -> GroupRecord | Decision:
    """The validated record of `msg`, or the INVALID decision refusing it."""
    if isinstance(msg, Undecodable):
        return answer(pb.ACK_STATUS_INVALID, msg.error)
    try:
        record = parse_group(msg, limits)
    except InvalidInput as error:
        return answer(pb.ACK_STATUS_INVALID, str(error))
    if record.actor_id != sender.actor_id:
        return answer(pb.ACK_STATUS_INVALID,
                      f"actor_id {shown(record.actor_id)} is not the stream's actor {sender.actor_id!r}")
    return record


def decide(record: GroupRecord, sender: Sender, prompt: PromptFacts, rules: Rules, queue_full: bool) -> Decision:
    """The table of the module docstring, for a record `examine` let through."""
    latest = rules.limits.latest_version
    stale = is_stale(record.policy_version, latest, rules.max_staleness)
    if prompt.state is PromptState.RETIRED:
        return answer(pb.ACK_STATUS_DUPLICATE, "already consumed")
    if prompt.state is PromptState.HELD:
        return answer(pb.ACK_STATUS_DUPLICATE, "already queued")
    if prompt.state is PromptState.UNISSUED and stale:
        return answer(pb.ACK_STATUS_STALE, RESTARTED_DETAIL)
    if prompt.state is not PromptState.OUTSTANDING or prompt.lease is None:
        return answer(pb.ACK_STATUS_INVALID, "group_id was never leased by this learner")
    if not may_answer(prompt.lease, sender.holder):
        return answer(pb.ACK_STATUS_INVALID, f"prompt {record.group_id} is leased to another actor",
                      lease_violations=1)
    if record.rejected_reason:
        return _rejection(record, sender, prompt, rules)
    if prompt.prompt_ids and list(prompt.prompt_ids) != record.prompt_ids:
        return answer(pb.ACK_STATUS_INVALID, "prompt_token_ids differ from the leased prompt")
    if stale:
        return answer(pb.ACK_STATUS_STALE,
                      f"policy_version {record.policy_version} is more than {rules.max_staleness} behind {latest}",
                      Effect.RELEASE)
    if queue_full:
        return answer(pb.ACK_STATUS_RETRY, "queue full")
    unscorable = sum(c.unscorable_reason is not None for c in record.completions)
    return answer(pb.ACK_STATUS_QUEUED, "", Effect.QUEUE, record, completions_unscorable=unscorable)


def may_answer(lease: LeaseInfo, holder: str) -> bool:
    """Whether `holder` may send the group (or the rejection) of a prompt under `lease`: it holds the
    lease or held it before (a late copy); a lease restored from a checkpoint ("" holder) is anyone's,
    since the actors that held it before the restart are unknown."""
    return lease.holder in ("", holder) or holder in lease.earlier


def prompt_limit(sender: Sender, rules: Rules) -> int | None:
    """The longest prompt `sender` must sample: its declared max_prompt_tokens (else the run's), capped
    by what fits its max_model_len; None when neither is known (its rejections cannot be checked)."""
    declared = sender.max_prompt_tokens or rules.limits.max_prompt_tokens
    if not declared:
        return None
    return min(declared, sender.max_model_len - 1) if sender.max_model_len > 0 else declared


def _rejection(record: GroupRecord, sender: Sender, prompt: PromptFacts, rules: Rules) -> Decision:
    limit = prompt_limit(sender, rules)
    length = len(prompt.prompt_ids)
    if limit is not None and length <= limit:
        return answer(pb.ACK_STATUS_INVALID,
                      f"{record.rejected_reason} refused: the prompt has {length} tokens, within the limit {limit}")
    return answer(pb.ACK_STATUS_CONSUMED, f"prompt retired: {record.rejected_reason}", Effect.RETIRE)

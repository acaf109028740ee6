"""Scored groups as the trainer sees them, and the checks that turn wire messages into them.

`parse_group` is the single gate between untrusted bytes and the learner: anything it lets
through has consistent shapes, finite non-positive logprobs, in-range token ids, a weight version per
token (never decreasing along a completion, between the group's policy_version, which is the oldest, and
the latest published one), a reward or an unscorable reason per completion, turns (multi-turn) that
tile the completion with zero logprobs on observation tokens and rewards that add up, training samples
(a trajectory split where the chat template could not extend it) that each fit the learner's longest
row, and every string and number within its documented bound (tandem_wire/limits.py). It raises
InvalidInput with a specific detail otherwise.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np

from learner.wire_bounds import (
    InvalidInput,
    check_metadata,
    check_nonnegative,
    check_text,
    check_wire_version,
    shown,
)
from tandem_wire import pb
from tandem_wire.limits import MAX_DETAIL_CHARS, MAX_GROUP_SIZE, MAX_ID_CHARS, MAX_TEXT_CHARS, MAX_TURNS
from tandem_wire.turns import TurnRecord

FINISH_REASONS = {
    pb.FINISH_REASON_STOP: "stop",
    pb.FINISH_REASON_LENGTH: "length",
    pb.FINISH_REASON_ABORT: "abort",
}
# The reasons an actor may give for refusing a prompt (ScoredGroup.rejected_reason).
REJECTED_REASONS = ("prompt_too_long",)


@dataclass
class CompletionRecord:
    token_ids: list[int]
    logprobs: list[float]  # behaviour-policy logprob of each token (pi_old); 0 on observation tokens
    finish_reason: str  # "stop" | "length" | "abort"
    reward: float | None
    unscorable_reason: str | None
    text: str = ""
    turns: list[TurnRecord] = field(default_factory=list)  # empty: one turn, every token sampled
    versions: list[int] = field(default_factory=list)  # the weight version that sampled each token

    @property
    def loss_mask(self) -> np.ndarray:
        """1 on each token the policy sampled, 0 on observation tokens; [len(token_ids)] float32."""
        if not self.turns:
            return np.ones(len(self.token_ids), np.float32)
        return np.concatenate([np.repeat(np.array([1, 0], np.float32), [t.sampled_tokens, t.observation_tokens])
                               for t in self.turns])

    def samples(self, prompt_ids: list[int]) -> list[tuple[list[int], int, int]]:
        """The training samples (one row each) as (their prompt, start, end) over `token_ids`: one, the
        group's prompt then every token, unless a turn with `context_ids` starts a new sample there."""
        prompts, starts, position = [prompt_ids], [0], 0
        for turn in self.turns:
            if turn.context_ids:
                prompts.append(turn.context_ids)
                starts.append(position)
            position += turn.sampled_tokens + turn.observation_tokens
        return list(zip(prompts, starts, [*starts[1:], len(self.token_ids)], strict=True))


@dataclass
class GroupRecord:
    group_id: str
    actor_id: str
    policy_version: int
    prompt_ids: list[int]
    completions: list[CompletionRecord]
    metadata: dict[str, str]
    rejected_reason: str | None = None
    timings: dict[str, float] = field(default_factory=dict)
    received_at: float = 0.0  # time.time() when the learner accepted it

    @property
    def tokens(self) -> int:
        """Completion tokens in the group (the unit of the token ledger, learner/service/accounting.py)."""
        return sum(len(c.token_ids) for c in self.completions)


@dataclass(frozen=True)
class GroupLimits:
    """What a valid group must satisfy; 0 / None disables a limit."""

    latest_version: int
    group_size: int = 0
    vocab_size: int | None = None
    max_prompt_tokens: int = 0
    max_sequence_tokens: int = 0  # prompt + one completion (the learner's largest length bucket)


def parse_group(msg: pb.ScoredGroup, limits: GroupLimits) -> GroupRecord:
    """Validate a wire group and convert it; raises InvalidInput(detail) on the first problem."""
    check_wire_version(msg.wire_version)
    check_text("group_id", msg.group_id, MAX_ID_CHARS, printable=True, required=True)
    check_text("actor_id", msg.actor_id, MAX_ID_CHARS, printable=True, required=True)
    if msg.policy_version < 0:
        raise InvalidInput(f"negative policy_version {msg.policy_version}")
    if msg.policy_version > limits.latest_version:
        raise InvalidInput(
            f"policy_version {msg.policy_version} is newer than the latest published "
            f"version {limits.latest_version}"
        )
    prompt_ids = list(msg.prompt_token_ids)
    if msg.rejected_reason:
        if msg.rejected_reason not in REJECTED_REASONS:
            raise InvalidInput(
                f"unknown rejected_reason {shown(msg.rejected_reason)} (allowed: {REJECTED_REASONS})"
            )
        if msg.completions:
            raise InvalidInput("a rejected prompt must carry no completions")
        return _record(msg, prompt_ids, [])
    if not prompt_ids:
        raise InvalidInput("empty prompt_token_ids")
    if limits.max_prompt_tokens and len(prompt_ids) > limits.max_prompt_tokens:
        raise InvalidInput(
            f"prompt has {len(prompt_ids)} tokens > max_prompt_tokens {limits.max_prompt_tokens}"
        )
    _check_token_ids("prompt_token_ids", prompt_ids, limits.vocab_size)
    if not msg.completions:
        raise InvalidInput("no completions")
    if limits.group_size and len(msg.completions) != limits.group_size:
        raise InvalidInput(
            f"group has {len(msg.completions)} completions, expected group_size {limits.group_size}"
        )
    if len(msg.completions) > MAX_GROUP_SIZE:
        raise InvalidInput(f"group has {len(msg.completions)} completions > {MAX_GROUP_SIZE}")
    completions = [_parse_completion(i, c) for i, c in enumerate(msg.completions)]
    _check_numbers(completions, limits.vocab_size)
    for i, completion in enumerate(completions):
        if completion.turns:
            _check_turns(f"completion {i}", completion, msg.policy_version, limits.latest_version, limits.vocab_size)
        if limits.max_sequence_tokens:
            _check_sample_lengths(f"completion {i}", completion, prompt_ids, limits.max_sequence_tokens)
    _check_versions(completions, msg.policy_version, limits.latest_version)
    return _record(msg, prompt_ids, completions)


def _parse_completion(i: int, c: pb.Completion) -> CompletionRecord:
    """One completion's shape, finish reason, score and text (its numbers are checked for the whole
    group at once, by _check_numbers)."""
    where = f"completion {i}"
    token_ids = list(c.token_ids)
    logprobs = list(c.logprobs)
    if not token_ids:
        raise InvalidInput(f"{where}: empty token_ids")
    if len(logprobs) != len(token_ids):
        raise InvalidInput(f"{where}: {len(logprobs)} logprobs for {len(token_ids)} tokens")
    if len(c.token_versions) != len(token_ids):
        raise InvalidInput(f"{where}: {len(c.token_versions)} token_versions for {len(token_ids)} tokens")
    if c.finish_reason not in FINISH_REASONS:
        raise InvalidInput(f"{where}: finish_reason {c.finish_reason} is not stop/length/abort")
    score = c.WhichOneof("score")
    if score is None:
        raise InvalidInput(f"{where}: neither reward nor unscorable_reason")
    reward = unscorable = None
    if score == "reward":
        reward = c.reward
        if not math.isfinite(reward):
            raise InvalidInput(f"{where}: non-finite reward {reward}")
    else:
        unscorable = check_text(f"{where}: unscorable_reason", c.unscorable_reason, MAX_DETAIL_CHARS)
        if not unscorable:
            raise InvalidInput(f"{where}: empty unscorable_reason")
    text = check_text(f"{where}: text", c.text, MAX_TEXT_CHARS)
    if len(c.turns) > MAX_TURNS:
        raise InvalidInput(f"{where}: {len(c.turns)} turns > {MAX_TURNS}")
    turns = [TurnRecord.of(t) for t in c.turns]
    return CompletionRecord(token_ids, logprobs, FINISH_REASONS[c.finish_reason], reward, unscorable, text, turns,
                            list(c.token_versions))


def _check_versions(completions: list[CompletionRecord], group_version: int, latest_version: int) -> None:
    """Every token's version lies between the group's and the latest published one and never decreases along
    its completion (a version loaded in flight moves the tokens after it to that one), and the group's is its
    oldest token's: the staleness bound counts that one. A turn's version is its oldest sampled token's."""
    for i, completion in enumerate(completions):
        versions = np.asarray(completion.versions, np.int64)
        if versions.min() < group_version or versions.max() > latest_version:
            raise InvalidInput(f"completion {i}: token versions {versions.min()}..{versions.max()} are outside the "
                               f"group's {group_version} .. the latest published {latest_version}")
        if (np.diff(versions) < 0).any():
            raise InvalidInput(f"completion {i}: token versions decrease")
        start = 0
        for k, turn in enumerate(completion.turns):
            sampled = versions[start:start + turn.sampled_tokens]
            if sampled.size and sampled.min() != turn.policy_version:
                raise InvalidInput(f"completion {i}: turn {k} policy_version {turn.policy_version} is not its "
                                   f"oldest token's {sampled.min()}")
            start += turn.sampled_tokens + turn.observation_tokens
    oldest = min(min(c.versions) for c in completions)
    if oldest != group_version:
        raise InvalidInput(f"the group's policy_version {group_version} is not its oldest token's {oldest}")


def _check_turns(where: str, completion: CompletionRecord, group_version: int, latest_version: int,
                 vocab_size: int | None) -> None:
    """Turns tile the completion, sampled by versions from the group's (parse_group checks it is the oldest
    turn's over all trajectories) to the latest, with logprob 0 on observation tokens and a trajectory
    reward that is the sum of the turns' rewards; a turn that starts a new sample is not the first,
    follows a turn without observation tokens, and its context's ids are in the vocabulary."""
    turns = completion.turns
    for k, turn in enumerate(turns):
        if turn.context_ids:
            if k == 0:
                raise InvalidInput(f"{where}: turn 0 has context_token_ids (the group's prompt is its context)")
            if turns[k - 1].observation_tokens:
                raise InvalidInput(f"{where}: turn {k} starts a new sample but turn {k - 1} has "
                                   f"{turns[k - 1].observation_tokens} observation tokens (they belong in its context)")
            _check_token_ids(f"{where}: turn {k} context_token_ids", turn.context_ids, vocab_size)
        if turn.sampled_tokens < 1 or turn.observation_tokens < 0:
            raise InvalidInput(f"{where}: turn {k} has {turn.sampled_tokens} sampled and "
                               f"{turn.observation_tokens} observation tokens (need >= 1 and >= 0)")
        if not group_version <= turn.policy_version <= latest_version:
            raise InvalidInput(f"{where}: turn {k} policy_version {turn.policy_version} is outside the group's "
                               f"{group_version} .. the latest published {latest_version}")
        if turn.reward is not None and not math.isfinite(turn.reward):
            raise InvalidInput(f"{where}: turn {k} has a non-finite reward {turn.reward}")
    if turns[-1].observation_tokens:
        raise InvalidInput(f"{where}: the last turn ends with {turns[-1].observation_tokens} observation tokens")
    covered = sum(turn.sampled_tokens + turn.observation_tokens for turn in turns)
    if covered != len(completion.token_ids):
        raise InvalidInput(f"{where}: turns cover {covered} tokens of {len(completion.token_ids)}")
    observed = np.asarray(completion.logprobs, np.float64)[completion.loss_mask == 0]
    if observed.any():
        raise InvalidInput(f"{where}: an observation token has logprob {observed[observed != 0][0]} (must be 0: "
                           "the policy did not sample it)")
    if completion.reward is not None:
        total = math.fsum(turn.reward or 0.0 for turn in turns)
        if not math.isclose(completion.reward, total, rel_tol=1e-6, abs_tol=1e-6):
            raise InvalidInput(f"{where}: reward {completion.reward} is not the sum of its turns' rewards {total}")


def _check_sample_lengths(where: str, completion: CompletionRecord, prompt_ids: list[int], limit: int) -> None:
    """Each training sample (its prompt or context, then its tokens) fits the learner's longest row."""
    for prompt, start, end in completion.samples(prompt_ids):
        if len(prompt) + end - start > limit:
            raise InvalidInput(f"{where}: a sample of {end - start} tokens after its prompt's {len(prompt)} "
                               f"exceeds max_sequence_tokens {limit}")


def _check_numbers(completions: list[CompletionRecord], vocab_size: int | None) -> None:
    """Token ids in range, logprobs finite and <= 0: one pass over the whole group (the common case),
    then, if anything is wrong, one completion at a time to name the first at fault."""
    tokens = [t for c in completions for t in c.token_ids]
    logprobs = np.fromiter((x for c in completions for x in c.logprobs), np.float64, len(tokens))
    in_vocab = vocab_size is None or max(tokens) < vocab_size
    if min(tokens) >= 0 and in_vocab and np.isfinite(logprobs).all() and logprobs.max() <= 0:
        return
    for i, c in enumerate(completions):
        where = f"completion {i}"
        _check_token_ids(f"{where} token_ids", c.token_ids, vocab_size)
        values = np.asarray(c.logprobs, dtype=np.float64)
        if not np.isfinite(values).all():
            raise InvalidInput(f"{where}: non-finite logprob")
        if (values > 0).any():
            raise InvalidInput(f"{where}: positive logprob {values.max()}")


def _check_token_ids(what: str, token_ids: list[int], vocab_size: int | None) -> None:
    low, high = min(token_ids), max(token_ids)
    if low < 0:
        raise InvalidInput(f"{what}: negative token id {low}")
    if vocab_size is not None and high >= vocab_size:
        raise InvalidInput(f"{what}: token id {high} >= vocab_size {vocab_size}")


def _record(msg: pb.ScoredGroup, prompt_ids: list[int], completions: list[CompletionRecord]) -> GroupRecord:
    t = msg.timings
    return GroupRecord(
        group_id=msg.group_id,
        actor_id=msg.actor_id,
        policy_version=msg.policy_version,
        prompt_ids=prompt_ids,
        completions=completions,
        metadata=check_metadata(msg.metadata),
        rejected_reason=msg.rejected_reason or None,
        timings={
            "sample_seconds": check_nonnegative("timings.sample_seconds", t.sample_seconds),
            "score_seconds": check_nonnegative("timings.score_seconds", t.score_seconds),
            "sampled_at": check_nonnegative("timings.sampled_at", t.sampled_at),
        },
        received_at=time.time(),
    )

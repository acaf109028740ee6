"""RL batch assembly: scored groups (from the learner service) → packed rows of a fixed token budget.

Every training sample (a prompt then one completion's tokens; a multi-turn trajectory that a chat template
split has one sample per part, each with its own prompt) is one *sequence* of the batch. Sequences are
packed into rows of `row_tokens` tokens, first-fit decreasing, each its own segment: it attends only to
itself (causal within the segment) and its positions restart at 0, so a row of short completions costs
what its tokens cost, not the longest completion's length. The rows then round up to a bucket (`bucket_rows`:
a multiple of `row_multiple`, micro-batches × data shards), so the jitted step sees one row length and few
row counts: each new batch shape is a new XLA compilation.

The advantages arrive computed (learner.rl_loop: the estimator, then the advantage rule per turn); a
completion's weight (0: unscorable, or a zero-signal group that dynamic sampling drops) multiplies its
loss mask. Observation tokens of a multi-turn completion (an environment's answers between the turns the
policy sampled) are in the row but out of the loss.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple, Protocol

import numpy as np

from learner.algo.advantages import GroupAdvantages
from tandem_wire.conventions import PASS_THRESHOLD


class CompletionLike(Protocol):
    token_ids: Sequence[int]
    logprobs: Sequence[float]
    reward: float | None  # None: unscorable
    turns: Sequence[object]  # multi-turn: one entry per assistant turn; empty: a single turn
    versions: Sequence[int]  # the weight version that sampled each token (empty: all the group's)

    @property
    def loss_mask(self) -> np.ndarray:
        """1 on the tokens the policy sampled, 0 on observation tokens (multi-turn)."""

    def samples(self, prompt_ids: list[int]) -> list[tuple[Sequence[int], int, int]]:
        """Training samples, one sequence each: (their prompt, start, end) over token_ids."""


class GroupLike(Protocol):
    """What assembly reads of a `learner.service.group_validation.GroupRecord`."""

    group_id: str
    policy_version: int
    prompt_ids: Sequence[int]
    completions: Sequence[CompletionLike]


class RLBatch(NamedTuple):
    """Arrays of one RL step, numpy, [B, T]; token-aligned (column t = token t).

    segment_ids numbers a row's sequences 1, 2, ... (0 = padding); positions restart at 0 in each.
    completion_mask is the completion's weight on its sampled tokens (0 on prompt, observation and padding
    tokens, and on unscorable and dropped completions); behaviour_logps[b, t] = log π_behaviour(token t) on
    completion tokens, 0 elsewhere; advantages[b, t] = the advantage of the turn that sampled token t.
    """

    input_ids: np.ndarray  # int32
    attention_mask: np.ndarray  # int32, 1 on real tokens
    segment_ids: np.ndarray  # int32
    positions: np.ndarray  # int32
    completion_mask: np.ndarray  # float32
    behaviour_logps: np.ndarray  # float32
    advantages: np.ndarray  # float32


class Sample(NamedTuple):
    """One sequence of the batch: its prompt, then a span of a completion's tokens with their loss
    weights, behaviour logprobs and advantages."""

    prompt: Sequence[int]
    tokens: np.ndarray
    weights: np.ndarray
    logprobs: np.ndarray
    advantages: np.ndarray

    def __len__(self) -> int:
        return len(self.prompt) + len(self.tokens)


def empty_rl_batch(rows: int, length: int) -> RLBatch:
    """An all-padding batch of `rows` × `length` (its shape and dtypes are what compiling a step needs)."""
    def grid(dtype: type) -> np.ndarray:
        return np.zeros((rows, length), dtype)

    return RLBatch(*(grid(np.int32) for _ in range(4)), *(grid(np.float32) for _ in range(3)))


def bucket_rows(rows: int, row_multiple: int = 1) -> int:
    """The rows a batch of `rows` packed rows is padded to: `row_multiple` × the smallest of 1, 2, 3, 4, 6,
    8, 12, 16, 24, ... (2^k and 3·2^k) that holds them. Packing gives a different row count nearly every
    step, and each new count is a new XLA compilation of the step (measured on the demo's model on CPU: 6 s
    each against a 0.45 s step; the demo test had 10 different counts in its first 10 steps); the buckets
    bound the shapes to two per doubling and the padding, all-masked rows, to under a third of the batch."""
    if rows < 1 or row_multiple < 1:
        raise ValueError(f"rows and row_multiple must be >= 1, got {rows}, {row_multiple}")
    units = -(-rows // row_multiple)
    power = 1 << (units - 1).bit_length()  # the smallest power of two >= units
    bucket = 3 * power // 4 if power >= 4 and units <= 3 * power // 4 else power
    return bucket * row_multiple


def pack(lengths: Sequence[int], row_tokens: int) -> list[list[int]]:
    """First-fit decreasing: the indices of the sequences each row holds (longest first; ties in input
    order, so the packing is deterministic). Every length must fit in a row."""
    too_long = [n for n in lengths if n > row_tokens]
    if too_long:
        raise ValueError(f"a sequence of {max(too_long)} tokens exceeds a row of {row_tokens}")
    rows: list[list[int]] = []
    free: list[int] = []
    for index in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        fitting = next((r for r, room in enumerate(free) if room >= lengths[index]), None)
        if fitting is None:
            rows.append([])
            free.append(row_tokens)
            fitting = len(rows) - 1
        rows[fitting].append(index)
        free[fitting] -= lengths[index]
    return rows


def completion_samples(group: GroupLike, completion: CompletionLike, weight: float,
                       token_advantages: np.ndarray) -> list[Sample]:
    """The sequences of one completion (one, or one per part of a trajectory a chat template split)."""
    tokens = np.asarray(completion.token_ids, np.int32)
    weights = weight * completion.loss_mask
    logprobs = np.asarray(completion.logprobs, np.float32)
    return [Sample(prompt, tokens[start:end], weights[start:end], logprobs[start:end], token_advantages[start:end])
            for prompt, start, end in completion.samples(list(group.prompt_ids))]


def assemble_rl_batch(
    groups: Sequence[GroupLike],
    advantages: Sequence[Sequence[np.ndarray]],
    weights: np.ndarray,
    *,
    pad_id: int,
    row_tokens: int,
    row_multiple: int = 1,
) -> tuple[RLBatch, dict[str, float]]:
    """Pack `groups` into an `RLBatch` and return it with its packing statistics.

    Args:
      advantages: per group, per completion, one advantage per token of its token_ids (observation
        tokens' are ignored); weights: [N, G] loss weight of each completion (GroupAdvantages.weights).
    Statistics: loss tokens, sequences, rows, and padding_fraction (padding / all tokens of the batch).
    """
    if not groups:
        raise ValueError("no groups to assemble")
    for group in groups:
        for completion in group.completions:
            if len(completion.logprobs) != len(completion.token_ids):
                raise ValueError(f"group {group.group_id}: {len(completion.token_ids)} tokens but "
                                 f"{len(completion.logprobs)} behaviour logprobs")
    samples = [sample for i, group in enumerate(groups) for j, completion in enumerate(group.completions)
               for sample in completion_samples(group, completion, float(weights[i][j]), advantages[i][j])]
    rows = pack([len(s) for s in samples], row_tokens)
    num_rows = bucket_rows(len(rows), row_multiple)

    def grid(dtype: type, fill: int = 0) -> np.ndarray:
        return np.full((num_rows, row_tokens), fill, dtype)

    batch = RLBatch(grid(np.int32, pad_id), grid(np.int32), grid(np.int32), grid(np.int32),
                    grid(np.float32), grid(np.float32), grid(np.float32))
    for row, members in enumerate(rows):
        offset = 0
        for segment, index in enumerate(members, start=1):
            sample = samples[index]
            first, last = offset + len(sample.prompt), offset + len(sample)
            batch.input_ids[row, offset:first] = sample.prompt
            batch.input_ids[row, first:last] = sample.tokens
            batch.attention_mask[row, offset:last] = 1
            batch.segment_ids[row, offset:last] = segment
            batch.positions[row, offset:last] = np.arange(len(sample))
            batch.completion_mask[row, first:last] = sample.weights
            batch.behaviour_logps[row, first:last] = sample.logprobs
            batch.advantages[row, first:last] = sample.advantages
            offset = last
    real = int(batch.attention_mask.sum())
    stats = {"loss_tokens": float(batch.completion_mask.astype(bool).sum()), "sequences": float(len(samples)),
             "rows": float(num_rows), "padding_fraction": 1.0 - real / batch.attention_mask.size}
    return batch, stats


def group_statistics(groups: Sequence[GroupLike], scored: GroupAdvantages, current_version: int
                     ) -> dict[str, float]:
    """Host-side statistics of a step's groups: reward mean/std over scorable completions, the pass rate,
    the fraction of zero-signal groups, unscorable completions, staleness (current_version −
    policy_version, the group's oldest token's) mean/max and its histogram (``staleness_groups/k``: groups
    k versions behind), the same per sampled token (``staleness_tokens_mean``, ``staleness_tokens/k``: a
    completion continued across weight loads has tokens of several versions), and with multi-turn
    completions their turns (mean, max), observation tokens and template splits."""
    rewards = np.array([[np.nan if c.reward is None else c.reward for c in g.completions] for g in groups])
    scorable = rewards[~np.isnan(rewards)]
    staleness = np.array([current_version - g.policy_version for g in groups], np.float64)
    completions = [c for g in groups for c in g.completions]
    token_staleness = current_version - np.concatenate(
        [np.asarray(c.versions or [g.policy_version] * len(c.token_ids), np.int64)[c.loss_mask > 0]
         for g in groups for c in g.completions])
    return {
        "reward_mean": float(scorable.mean()) if scorable.size else float("nan"),
        "reward_std": float(scorable.std()) if scorable.size else float("nan"),
        # share of scorable completions that pass: the success rate for 0/1 rewards
        "pass_rate": float((scorable > PASS_THRESHOLD).mean()) if scorable.size else float("nan"),
        "zero_signal_group_frac": scored.num_zero_signal_groups / len(groups),
        "unscorable_completions": float(scored.num_unscorable),
        "staleness_mean": float(staleness.mean()),
        "staleness_max": float(staleness.max()),
        **{f"staleness_groups/{k}": float(n) for k, n in enumerate(np.bincount(staleness.astype(np.int64)))},
        "staleness_tokens_mean": float(token_staleness.mean()),
        **{f"staleness_tokens/{k}": float(n) for k, n in enumerate(np.bincount(token_staleness))},
        "num_groups": float(len(groups)),
        **_turn_stats(groups, completions),
    }


def _turn_stats(groups: Sequence[GroupLike], completions: Sequence[CompletionLike]) -> dict[str, float]:
    """Multi-turn batches only: assistant turns per completion (mean, max), the observation tokens the
    rows hold outside the loss, and the samples added by splitting trajectories at template breaks."""
    turns = [len(c.turns) or 1 for c in completions]
    if max(turns) == 1:
        return {}
    observed = sum(len(c.token_ids) - int(c.loss_mask.sum()) for c in completions)
    splits = sum(len(c.samples(list(g.prompt_ids))) - 1 for g in groups for c in g.completions)
    return {"turns_mean": float(np.mean(turns)), "turns_max": float(max(turns)),
            "observation_tokens": float(observed), "split_samples": float(splits)}

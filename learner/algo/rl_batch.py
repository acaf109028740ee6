"""RL batch assembly: scored groups (from the learner service) → fixed-shape padded arrays.

One row per completion: prompt tokens then completion tokens, right-padded to a length bucket
(the smallest of `length_buckets` that fits), rows padded to `num_rows`, so the jitted step sees
few distinct shapes and does not recompile every step. A multi-turn trajectory that a chat template
split (a turn that starts a new sample from the conversation rendered afresh) takes one row per sample,
each with its own prompt; the rows then round up to a multiple of `num_rows`. A multi-turn
completion's observation tokens (an environment's answers between the turns the policy sampled) are in
the row but out of the loss (its `loss_mask`). Advantages are per token: the group's statistics come from
`learner.algo.advantages.group_advantages` (unscorable completions: advantage 0, weight 0; DAPO dynamic
sampling: zero-signal groups weight 0 when 'drop'), and the advantage rule
(`learner.algo.turn_advantages`, default: the trajectory's advantage on every turn) gives each turn of
a completion its advantage; a completion's weight multiplies its loss mask.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple, Protocol

import numpy as np

from learner.algo.advantages import STD_EPSILON, GroupAdvantages, group_advantages
from learner.algo.turn_advantages import GroupTurnRewards, TurnAdvantageFn, trajectory, turn_advantages
from rewards.types import PASS_THRESHOLD


class CompletionLike(Protocol):
    token_ids: Sequence[int]
    logprobs: Sequence[float]
    reward: float | None  # None: unscorable
    turns: Sequence[object]  # multi-turn: one entry per assistant turn; empty: a single turn

    @property
    def loss_mask(self) -> np.ndarray:
        """1 on the tokens the policy sampled, 0 on observation tokens (multi-turn)."""

    def samples(self, prompt_ids: list[int]) -> list[tuple[Sequence[int], int, int]]:
        """Training samples, one row each: (their prompt, start, end) over token_ids."""


class GroupLike(Protocol):
    """What assembly reads of a `learner.service.group_validation.GroupRecord`."""

    group_id: str
    policy_version: int
    prompt_ids: Sequence[int]
    completions: Sequence[CompletionLike]


class RLBatch(NamedTuple):
    """Arrays of one RL step, numpy, [B, T] unless noted; token-aligned (column t = token t).

    completion_mask is 1 on sampled completion tokens of rows that enter the loss (0 on prompt,
    observation and padding tokens, and on unscorable and dropped rows); behaviour_logps[b, t] =
    log π_behaviour(token t) on completion tokens, 0 elsewhere; advantages[b, t] = the advantage of the
    turn that sampled token t (single-turn: the completion's), 0 on prompt, observation and padding.
    """

    input_ids: np.ndarray  # int32
    attention_mask: np.ndarray  # int32
    completion_mask: np.ndarray  # float32
    behaviour_logps: np.ndarray  # float32
    advantages: np.ndarray  # float32


def empty_rl_batch(rows: int, length: int) -> RLBatch:
    """An all-padding batch of `rows` × `length` (its shape and dtypes are what compiling a step needs)."""
    def grid(dtype: type) -> np.ndarray:
        return np.zeros((rows, length), dtype)

    return RLBatch(grid(np.int32), grid(np.int32), grid(np.float32), grid(np.float32), grid(np.float32))


def bucket_for(length: int, buckets: Sequence[int]) -> int:
    """The smallest of `buckets` that holds a sequence of `length` tokens."""
    fitting = [b for b in sorted(buckets) if b >= length]
    if not fitting:
        raise ValueError(f"a sequence of {length} tokens exceeds the largest length bucket {max(buckets)}")
    return fitting[0]


def pow2_buckets(max_len: int, min_len: int = 16) -> tuple[int, ...]:
    """Length buckets min_len, 2·min_len, ... up to and including max_len."""
    if not 0 < min_len <= max_len:
        raise ValueError(f"need 0 < min_len <= max_len, got {min_len}, {max_len}")
    buckets = []
    length = min_len
    while length < max_len:
        buckets.append(length)
        length *= 2
    return (*buckets, max_len)


def _turn_stats(completions: Sequence[CompletionLike], split_samples: int) -> dict[str, float]:
    """Multi-turn batches only: assistant turns per completion (mean, max), the observation tokens the
    rows hold outside the loss, and the samples added by splitting trajectories at template breaks."""
    turns = [len(c.turns) or 1 for c in completions]
    if max(turns) == 1:
        return {}
    observed = sum(len(c.token_ids) - int(c.loss_mask.sum()) for c in completions)
    return {"turns_mean": float(np.mean(turns)), "turns_max": float(max(turns)),
            "observation_tokens": float(observed), "split_samples": float(split_samples)}


def _turn_lengths(completion: CompletionLike) -> list[int]:
    """Tokens of each turn, its observation's included (one turn: all of them)."""
    return [t.sampled_tokens + t.observation_tokens for t in completion.turns] or [len(completion.token_ids)]


def _group_turn_advantages(group: GroupLike, index: int, adv: GroupAdvantages, advantage: TurnAdvantageFn,
                           std_normalize: bool) -> dict[int, np.ndarray]:
    """Completion j of the group → its turns' advantages, for the scorable completions of a group with
    signal (every other completion's advantage is 0)."""
    if adv.zero_signal[index]:
        return {}
    scorable = [j for j, c in enumerate(group.completions) if c.reward is not None]
    rewards = GroupTurnRewards(
        turn_rewards=tuple(np.array([t.reward or 0.0 for t in group.completions[j].turns]
                                    or [group.completions[j].reward], np.float64) for j in scorable),
        baseline=float(adv.baselines[index]), scale=float(adv.scales[index]), epsilon=STD_EPSILON,
        std_normalize=std_normalize)
    return dict(zip(scorable, turn_advantages(advantage, rewards), strict=True))


def assemble_rl_batch(
    groups: Sequence[GroupLike],
    *,
    pad_id: int,
    current_version: int,
    length_buckets: Sequence[int],
    num_rows: int | None = None,
    std_normalize: bool = True,
    dynamic_sampling: str = "off",
    advantage: TurnAdvantageFn = trajectory,
) -> tuple[RLBatch, dict[str, float]]:
    """Pad `groups` into an `RLBatch` and return it with host-side batch statistics.

    Statistics: reward mean/std over scorable completions, fraction of zero-signal groups, count of
    unscorable completions, staleness (current_version − policy_version) mean/max over groups and its
    histogram (``staleness_groups/k``: groups k versions behind), the number of loss tokens, and with
    multi-turn completions their turns (mean, max) and observation tokens. `advantage` spreads each
    group's rewards over its completions' turns (`learner.algo.turn_advantages`).
    """
    if not groups:
        raise ValueError("no groups to assemble")
    group_size = len(groups[0].completions)
    for group in groups:
        if len(group.completions) != group_size or group_size == 0:
            raise ValueError(f"group {group.group_id} has {len(group.completions)} completions; "
                             f"every group of a batch needs the same positive number ({group_size})")
        for completion in group.completions:
            if len(completion.logprobs) != len(completion.token_ids):
                raise ValueError(f"group {group.group_id}: {len(completion.token_ids)} tokens but "
                                 f"{len(completion.logprobs)} behaviour logprobs")
    rewards = np.array([[np.nan if c.reward is None else c.reward for c in g.completions] for g in groups],
                       np.float64)
    adv = group_advantages(rewards, std_normalize=std_normalize, dynamic_sampling=dynamic_sampling)

    completions = len(groups) * group_size
    num_rows = completions if num_rows is None else num_rows
    if num_rows < completions:
        raise ValueError(f"{completions} completions do not fit in num_rows={num_rows}")
    samples = [[c.samples(list(g.prompt_ids)) for c in g.completions] for g in groups]
    rows = sum(len(s) for group_samples in samples for s in group_samples)
    # Samples split by a template take more rows: a multiple of num_rows keeps micro-batches and shards even.
    num_rows *= -(-rows // num_rows)
    length = bucket_for(max(len(prompt) + end - start for group_samples in samples for s in group_samples
                            for prompt, start, end in s), length_buckets)

    input_ids = np.full((num_rows, length), pad_id, np.int32)
    attention_mask = np.zeros((num_rows, length), np.int32)
    completion_mask = np.zeros((num_rows, length), np.float32)
    behaviour = np.zeros((num_rows, length), np.float32)
    advantages = np.zeros((num_rows, length), np.float32)
    row = 0
    for i, group in enumerate(groups):
        per_turn = _group_turn_advantages(group, i, adv, advantage, std_normalize)
        for j, completion in enumerate(group.completions):
            tokens = np.asarray(completion.token_ids, np.int32)
            mask = adv.weights[i, j] * completion.loss_mask
            logprobs = np.asarray(completion.logprobs, np.float32)
            token_advantages = (np.repeat(per_turn[j], _turn_lengths(completion)) * completion.loss_mask
                                if j in per_turn else np.zeros(len(tokens)))
            for prompt, start, end in samples[i][j]:  # one row per training sample
                first, last = len(prompt), len(prompt) + end - start
                input_ids[row, :first] = prompt
                input_ids[row, first:last] = tokens[start:end]
                attention_mask[row, :last] = 1
                completion_mask[row, first:last] = mask[start:end]
                behaviour[row, first:last] = logprobs[start:end]
                advantages[row, first:last] = token_advantages[start:end]
                row += 1

    scorable = rewards[~np.isnan(rewards)]
    staleness = np.array([current_version - g.policy_version for g in groups], np.float64)
    stats = {
        "reward_mean": float(scorable.mean()) if scorable.size else float("nan"),
        "reward_std": float(scorable.std()) if scorable.size else float("nan"),
        # share of scorable completions that pass: the success rate for 0/1 rewards
        "pass_rate": float((scorable > PASS_THRESHOLD).mean()) if scorable.size else float("nan"),
        "zero_signal_group_frac": adv.num_zero_signal_groups / len(groups),
        "unscorable_completions": float(adv.num_unscorable),
        "staleness_mean": float(staleness.mean()),
        "staleness_max": float(staleness.max()),
        # the histogram: groups k versions behind, for k = 0 .. the oldest in the batch
        **{f"staleness_groups/{k}": float(n) for k, n in enumerate(np.bincount(staleness.astype(np.int64)))},
        "num_groups": float(len(groups)),
        "loss_tokens": float(completion_mask.astype(bool).sum()),
        **_turn_stats([c for g in groups for c in g.completions], rows - completions),
    }
    return RLBatch(input_ids, attention_mask, completion_mask, behaviour, advantages), stats

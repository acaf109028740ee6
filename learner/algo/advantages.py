"""Group-relative advantages (GRPO; Dr.GRPO without std; DAPO dynamic sampling).

Rewards arrive per group of G completions of one prompt, on the host, so this is numpy. A completion
whose reward could not be computed (reward worker timeout, parse failure: reward NaN, or
`scorable=False`) is *unscorable*: it is left out of its group's mean and std, gets advantage 0 and
weight 0, so it neither moves the baseline nor enters the loss.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from learner.schema import DYNAMIC_SAMPLING

STD_EPSILON = 1e-4  # ε of A = (R − mean) / (std + ε)


@dataclasses.dataclass(frozen=True)
class GroupAdvantages:
    """Per-completion advantages [N, G], loss weights [N, G] (0 = leave out of the loss), each group's
    baseline b and scale s [N] (A = (R − b) / s where the group has signal) and counts."""

    advantages: np.ndarray
    weights: np.ndarray
    baselines: np.ndarray
    scales: np.ndarray
    zero_signal: np.ndarray  # [N] bool
    num_scorable: int
    num_unscorable: int
    num_zero_signal_groups: int


def group_advantages(
    rewards: np.ndarray,
    scorable: np.ndarray | None = None,
    *,
    std_normalize: bool = True,
    epsilon: float = STD_EPSILON,
    dynamic_sampling: str = "off",
) -> GroupAdvantages:
    """A_ij = (R_ij − mean_j R_ij) / (std_j R_ij + ε)  over the scorable completions j of group i.

    std is the sample std (ddof=1, as tunix and TRL); std_normalize=False gives Dr.GRPO's
    A_ij = R_ij − mean_j R_ij. A group is *zero-signal* when it has fewer than two scorable
    completions or all its scorable rewards are equal: every advantage in it is 0. With
    dynamic_sampling='drop' or 'fill' its completions also get weight 0 (DAPO's dynamic sampling: the
    group is out of the loss and its denominators; with 'fill' the RL loop has already replaced such
    groups); 'count' and 'off' keep them in the loss (KL term only).

    Args:
      rewards: [N, G] float; NaN marks an unscorable completion.
      scorable: optional [N, G] bool, False marks an unscorable completion (ANDed with ~isnan).
    """
    if dynamic_sampling not in DYNAMIC_SAMPLING:
        raise ValueError(f"dynamic_sampling must be one of {DYNAMIC_SAMPLING}, got {dynamic_sampling!r}")
    rewards = np.asarray(rewards, np.float64)
    if rewards.ndim != 2:
        raise ValueError(f"rewards must be [num_groups, group_size], got shape {rewards.shape}")
    valid = ~np.isnan(rewards)
    if scorable is not None:
        scorable = np.asarray(scorable, bool)
        if scorable.shape != rewards.shape:
            raise ValueError(f"scorable shape {scorable.shape} != rewards shape {rewards.shape}")
        valid &= scorable
    if np.isinf(rewards[valid]).any():
        raise ValueError("rewards must be finite (use NaN to mark an unscorable completion)")

    r = np.where(valid, rewards, 0.0)
    count = valid.sum(axis=1, keepdims=True)
    mean = r.sum(axis=1, keepdims=True) / np.maximum(count, 1)
    centred = np.where(valid, r - mean, 0.0)
    # Equal rewards: use the exact spread (max − min) rather than a float std that may be ~1e-17.
    highest = np.where(valid, r, -np.inf).max(1, keepdims=True)
    spread = highest - np.where(valid, r, np.inf).min(1, keepdims=True)
    zero_signal = (count < 2) | ~(spread > 0)
    scale = np.ones_like(mean)
    if std_normalize:
        scale = np.sqrt((centred**2).sum(axis=1, keepdims=True) / np.maximum(count - 1, 1)) + epsilon
    advantages = np.where(zero_signal, 0.0, centred / scale)

    weights = valid.copy()
    if dynamic_sampling in ("drop", "fill"):
        weights &= ~zero_signal
    return GroupAdvantages(
        advantages=advantages,  # float64: the batch casts them; per-turn rules reuse them exactly
        weights=weights.astype(np.float32),
        baselines=mean[:, 0],
        scales=scale[:, 0],
        zero_signal=zero_signal[:, 0],
        num_scorable=int(valid.sum()),
        num_unscorable=int((~valid).sum()),
        num_zero_signal_groups=int(zero_signal.sum()),
    )


def has_signal(rewards: list[float | None]) -> bool:
    """Whether one group's rewards (None: unscorable) give any non-zero advantage."""
    row = np.array([[np.nan if r is None else r for r in rewards]], np.float64)
    return group_advantages(row).num_zero_signal_groups == 0

"""Advantage estimators as plug-ins (`algo.estimator`): group-relative advantages of scored groups.

Rewards arrive per group of G completions of one prompt, on the host, so this is numpy. For group i
with scorable completions j (R_ij their rewards, n_i of them):

    grpo          A_ij = (R_ij − mean_j R_ij) / (std_j R_ij + ε)        DeepSeekMath (std with ddof=1, as
                                                                         tunix and TRL)
    dr_grpo       A_ij =  R_ij − mean_j R_ij                             Dr.GRPO: no std, no length bias
    rloo          A_ij =  R_ij − (Σ_{j'≠j} R_ij') / (n_i − 1)            RLOO: leave-one-out baseline
                       = n_i / (n_i − 1) · (R_ij − mean_j R_ij)
    reinforce_pp  A_ij = (R_ij − mean_j R_ij) / (std_{batch}(R − mean_group R) + ε)
                                                                         REINFORCE++-baseline: group
                                                                         mean, then the batch's std

reinforce_pp is a documented variant of the paper's Eq. 10: it divides each completion's centred reward
by the std (ddof=1) of the batch's centred rewards and does not subtract their batch mean (which is 0
up to unscorable completions anyway) after the group mean.

Each is registered with `@estimator("name", divides_by_std=..., group_baseline=...)`; a user's is either
registered the same way (its module imported first) or named ``"package.module:function"`` (decorated
or not; undecorated it is taken to divide by no std and to have a group baseline). The record, not the
name, is what the pipeline reads: `divides_by_std` tells the per-turn rules (learner.algo.
turn_advantages) whether the group's scale is a std, `group_baseline` whether every completion shares
the group's baseline b (rloo's leave-one-out baseline is each completion's own, so only the
`trajectory` rule may spread it over turns).

A completion whose reward could not be computed (reward worker timeout, parse failure: reward NaN, or
`scorable=False`) is *unscorable*: it is left out of its group's statistics, gets advantage 0 and
weight 0, so it neither moves the baseline nor enters the loss. A group is *zero-signal* when it has
fewer than two scorable completions or all its scorable rewards are equal: every advantage in it is 0,
whatever the estimator.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

from learner.schema import DYNAMIC_SAMPLING
from tandem_wire.conventions import import_reference

STD_EPSILON = 1e-4  # ε of the std normalisations


@dataclasses.dataclass(frozen=True)
class GroupAdvantages:
    """Per-completion advantages [N, G], loss weights [N, G] (0 = leave out of the loss), each group's
    baseline b and scale s [N] (the group-baseline estimators' A = (R − b) / s where the group has
    signal; rloo's b is the group mean, its own baselines leave each completion out) and counts."""

    advantages: np.ndarray
    weights: np.ndarray
    baselines: np.ndarray
    scales: np.ndarray
    zero_signal: np.ndarray  # [N] bool
    num_scorable: int
    num_unscorable: int
    num_zero_signal_groups: int


@dataclasses.dataclass(frozen=True)
class Scorable:
    """One batch's rewards as an estimator sees them: R [N, G] (0 where unscorable), the mask of scorable
    completions, their count per group n [N, 1], the group means [N, 1] and the centred rewards R − mean
    (0 where unscorable)."""

    rewards: np.ndarray
    valid: np.ndarray
    count: np.ndarray
    mean: np.ndarray
    centred: np.ndarray


# (scorable, ε) -> (advantages [N, G], scales [N, 1]); zero-signal groups are zeroed afterwards
EstimatorFn = Callable[[Scorable, float], tuple[np.ndarray, np.ndarray]]


@dataclasses.dataclass(frozen=True)
class Estimator:
    """A registered estimator: its function and what the pipeline needs to know about it."""

    fn: EstimatorFn
    divides_by_std: bool
    """whether its scale s is a std (the per-turn rules then normalise by one too)"""
    group_baseline: bool = True
    """whether every completion of a group shares the baseline b (False: each has its own, as rloo)"""


_REGISTRY: dict[str, Estimator] = {}
_ATTRIBUTE = "__tandem_estimator__"


def estimator(name: str, *, divides_by_std: bool, group_baseline: bool = True
              ) -> Callable[[EstimatorFn], EstimatorFn]:
    """Decorator registering an estimator under `name` (signature: `EstimatorFn`)."""
    if not name or ":" in name:
        raise ValueError(f"estimator name must be non-empty and contain no ':', got {name!r}")

    def register(fn: EstimatorFn) -> EstimatorFn:
        if name in _REGISTRY and _REGISTRY[name].fn is not fn:
            raise ValueError(f"estimator {name!r} is already registered")
        record = Estimator(fn, divides_by_std, group_baseline)
        _REGISTRY[name] = record
        setattr(fn, _ATTRIBUTE, record)
        return fn

    return register


def resolve_estimator(ref: str) -> Estimator:
    """The estimator `ref` names: a registered name or ``"package.module:function"``."""
    if ":" in ref:
        fn = import_reference(ref, "estimator")
        return getattr(fn, _ATTRIBUTE, None) or Estimator(fn, divides_by_std=False)
    if ref not in _REGISTRY:
        raise ValueError(f"unknown estimator {ref!r}; registered: {sorted(_REGISTRY)} (or 'package.module:function')")
    return _REGISTRY[ref]


@estimator("grpo", divides_by_std=True)
def grpo(s: Scorable, epsilon: float) -> tuple[np.ndarray, np.ndarray]:
    """(R − mean) / (std + ε), the group's sample std (ddof=1)."""
    scale = np.sqrt((s.centred**2).sum(axis=1, keepdims=True) / np.maximum(s.count - 1, 1)) + epsilon
    return s.centred / scale, scale


@estimator("dr_grpo", divides_by_std=False)
def dr_grpo(s: Scorable, epsilon: float) -> tuple[np.ndarray, np.ndarray]:
    """R − mean."""
    return s.centred, np.ones_like(s.mean)


@estimator("rloo", divides_by_std=False, group_baseline=False)
def rloo(s: Scorable, epsilon: float) -> tuple[np.ndarray, np.ndarray]:
    """R − (the group's other rewards' mean) = n / (n − 1) · (R − mean)."""
    return s.centred * s.count / np.maximum(s.count - 1, 1), np.ones_like(s.mean)


@estimator("reinforce_pp", divides_by_std=True)
def reinforce_pp(s: Scorable, epsilon: float) -> tuple[np.ndarray, np.ndarray]:
    """(R − mean) / (std over the batch's scorable completions of R − mean + ε)."""
    centred = s.centred[s.valid]
    std = centred.std(ddof=1) if centred.size > 1 else 0.0
    scale = np.full_like(s.mean, std + epsilon)
    return s.centred / scale, scale


def group_advantages(
    rewards: np.ndarray,
    scorable: np.ndarray | None = None,
    *,
    estimator: str | EstimatorFn = "grpo",
    epsilon: float = STD_EPSILON,
    dynamic_sampling: str = "off",
) -> GroupAdvantages:
    """The `estimator`'s advantages over the scorable completions of each group (module docstring);
    `estimator` is a name `resolve_estimator` takes, or an estimator function itself.

    With dynamic_sampling='drop' or 'fill' the completions of a zero-signal group also get weight 0
    (DAPO's dynamic sampling: the group is out of the loss and its denominators; with 'fill' the RL
    loop has already replaced such groups); 'count' and 'off' keep them in the loss (KL term only).

    Args:
      rewards: [N, G] float; NaN marks an unscorable completion.
      scorable: optional [N, G] bool, False marks an unscorable completion (ANDed with ~isnan).
    """
    if dynamic_sampling not in DYNAMIC_SAMPLING:
        raise ValueError(f"dynamic_sampling must be one of {DYNAMIC_SAMPLING}, got {dynamic_sampling!r}")
    fn = resolve_estimator(estimator).fn if isinstance(estimator, str) else estimator
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
    advantages, scale = fn(Scorable(r, valid, count, mean, centred), epsilon)
    advantages = np.where(zero_signal | ~valid, 0.0, advantages)

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

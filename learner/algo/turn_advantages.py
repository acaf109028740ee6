"""Per-turn advantages of multi-turn trajectories: the choosable rule (`algo.advantage`) that turns a
group's rewards into one advantage per assistant turn, which every sampled token of that turn gets.

The group's statistics come from `learner.algo.advantages.group_advantages` over the trajectories'
summed rewards R_j = Σ_t r_jt: baseline b = mean_j R_j and scale s = std_j R_j + ε (s = 1 without
std_normalize). Built-in rules, for trajectory j and its turn t of T_j:

    trajectory     A_jt = (R_j − b) / s                       GRPO: every turn gets the trajectory's advantage
    reward_to_go   A_jt = (Σ_{k≥t} r_jk − b) / s              a turn is credited with the rewards after it only
    per_turn_grpo  A_jt = (r_jt − mean_{j'} r_j't) / (std_{j'} r_j't + ε)   over the trajectories j' that
                   reached turn t (without std_normalize: not divided)

`trajectory` and `reward_to_go` are unbiased up to GRPO's own std scaling: a reward cannot be credited to
a turn that came after it, and b does not depend on the trajectory's actions. `per_turn_grpo` is biased
whenever trajectories have different lengths: the trajectories that reach turn t are selected by their
earlier turns (a model that solves a task at once never reaches turn 2, so turn 2 is compared only among
the ones that failed), and a turn's reward is credited to that turn alone, not to the turns that led to it.

A user's rule is a function `fn(group: GroupTurnRewards) -> Sequence[np.ndarray]` named
``"package.module:function"``. Whatever the rule, a group with no signal (fewer than two scorable
trajectories, or equal summed rewards) gets advantage 0 and unscorable trajectories weight 0, as for
single-turn groups, so dynamic sampling and `train.skip_no_signal` mean the same thing.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import numpy as np

from learner.algo.advantages import group_advantages
from rewards.registry import import_reference

TRAJECTORY = "trajectory"


@dataclasses.dataclass(frozen=True)
class GroupTurnRewards:
    """One group's rewards as an advantage rule sees them (scorable trajectories only)."""

    turn_rewards: tuple[np.ndarray, ...]
    """per trajectory, its turns' rewards (0 for a turn the environment gave none); they sum to R_j"""
    baseline: float
    """b: the mean of the trajectories' summed rewards"""
    scale: float
    """s: their std + ε with std_normalize, else 1"""
    epsilon: float
    """the ε of the group's std"""
    std_normalize: bool
    """whether the run divides by a std (False: Dr.GRPO)"""


TurnAdvantageFn = Callable[[GroupTurnRewards], Sequence[np.ndarray]]


def trajectory(group: GroupTurnRewards) -> list[np.ndarray]:
    """A_jt = (R_j − b) / s on every turn."""
    return [np.full(len(r), (r.sum() - group.baseline) / group.scale) for r in group.turn_rewards]


def reward_to_go(group: GroupTurnRewards) -> list[np.ndarray]:
    """A_jt = (Σ_{k≥t} r_jk − b) / s: the first turn's is the trajectory's advantage."""
    return [(np.cumsum(r[::-1])[::-1] - group.baseline) / group.scale for r in group.turn_rewards]


def per_turn_grpo(group: GroupTurnRewards) -> list[np.ndarray]:
    """A_jt = (r_jt − mean r_·t) / (std r_·t + ε) over the trajectories that reached turn t (biased: see
    the module's docstring): GRPO's own normalisation with each turn index as a group; a turn that only
    one trajectory reached, or where all rewards are equal, gets 0."""
    by_turn = np.full((max(len(r) for r in group.turn_rewards), len(group.turn_rewards)), np.nan)
    for j, rewards in enumerate(group.turn_rewards):  # NaN: the trajectory did not reach that turn
        by_turn[:len(rewards), j] = rewards
    advantages = group_advantages(by_turn, std_normalize=group.std_normalize, epsilon=group.epsilon).advantages
    return [advantages[:len(r), j] for j, r in enumerate(group.turn_rewards)]


BUILTIN: dict[str, TurnAdvantageFn] = {"trajectory": trajectory, "reward_to_go": reward_to_go,
                                       "per_turn_grpo": per_turn_grpo}


def resolve_turn_advantage(ref: str) -> TurnAdvantageFn:
    """The rule `ref` names: a built-in (`BUILTIN`) or ``"package.module:function"``."""
    if ":" in ref:
        return import_reference(ref, "advantage")
    if ref not in BUILTIN:
        raise ValueError(f"unknown advantage {ref!r}; built in: {sorted(BUILTIN)} (or 'package.module:function')")
    return BUILTIN[ref]


def turn_advantages(fn: TurnAdvantageFn, group: GroupTurnRewards) -> list[np.ndarray]:
    """`fn`'s advantages for `group`, checked: one finite number per turn of each trajectory."""
    result = list(fn(group))
    if len(result) != len(group.turn_rewards):
        raise ValueError(f"advantage rule returned {len(result)} trajectories' advantages for "
                         f"{len(group.turn_rewards)}")
    checked = []
    for j, (advantages, rewards) in enumerate(zip(result, group.turn_rewards, strict=True)):
        advantages = np.asarray(advantages, np.float64)
        if advantages.shape != rewards.shape or not np.isfinite(advantages).all():
            raise ValueError(f"advantage rule gave trajectory {j} advantages {advantages!r}; need "
                             f"{len(rewards)} finite numbers, one per turn")
        checked.append(advantages)
    return checked

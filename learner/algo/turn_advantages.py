"""Per-turn advantages of multi-turn trajectories: the choosable rule (`algo.advantage`) that turns a
group's rewards into one advantage per assistant turn, which every sampled token of that turn gets.

The group's statistics come from `learner.algo.advantages.group_advantages` over the trajectories'
summed rewards R_j = Σ_t r_jt: baseline b = mean_j R_j and the estimator's scale s (grpo: std_j R_j + ε;
dr_grpo: 1; reinforce_pp: the batch's std + ε; an estimator without a group baseline, as rloo's
per-completion one, takes `trajectory` only).
Built-in rules, for trajectory j and its turn t of T_j:

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
from typing import Any

import numpy as np

from learner.algo.advantages import STD_EPSILON, GroupAdvantages, dr_grpo, group_advantages, grpo
from tandem_wire.conventions import import_reference

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
    """whether the run's estimator divides by a std (its registry record's divides_by_std)"""


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
    normalise = grpo if group.std_normalize else dr_grpo
    advantages = group_advantages(by_turn, estimator=normalise, epsilon=group.epsilon).advantages
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


def token_advantages(groups: Sequence[Any], scored: GroupAdvantages, rule: TurnAdvantageFn,
                     std_normalize: bool) -> list[list[np.ndarray]]:
    """Per group, per completion: one advantage per token of its token_ids, each sampled token its turn's
    (`rule`; `trajectory`: the estimator's advantage of the completion, on every turn), 0 on observation
    tokens, and 0 throughout for an unscorable completion or a group without signal.

    `groups` are `learner.algo.rl_batch.GroupLike` (completions with token_ids, reward, turns, loss_mask)."""
    result = []
    for i, group in enumerate(groups):
        per_turn = {} if scored.zero_signal[i] else _turn_values(group, i, scored, rule, std_normalize)
        result.append([np.repeat(per_turn[j], _turn_lengths(c)) * c.loss_mask if j in per_turn
                       else np.zeros(len(c.token_ids)) for j, c in enumerate(group.completions)])
    return result


def _turn_values(group: Any, index: int, scored: GroupAdvantages, rule: TurnAdvantageFn,
                 std_normalize: bool) -> dict[int, np.ndarray]:
    """Completion j of a group with signal → its turns' advantages, for the group's scorable completions."""
    scorable = [j for j, c in enumerate(group.completions) if c.reward is not None]
    if rule is trajectory:  # exactly the estimator's (whose baseline may be per completion, not b)
        return {j: np.full(len(group.completions[j].turns) or 1, scored.advantages[index, j]) for j in scorable}
    rewards = GroupTurnRewards(
        turn_rewards=tuple(np.array([t.reward or 0.0 for t in group.completions[j].turns]
                                    or [group.completions[j].reward], np.float64) for j in scorable),
        baseline=float(scored.baselines[index]), scale=float(scored.scales[index]), epsilon=STD_EPSILON,
        std_normalize=std_normalize)
    return dict(zip(scorable, turn_advantages(rule, rewards), strict=True))


def _turn_lengths(completion: Any) -> list[int]:
    """Tokens of each turn, its observation's included (one turn: all of them)."""
    return [t.sampled_tokens + t.observation_tokens for t in completion.turns] or [len(completion.token_ids)]

"""Per-turn advantages (`algo.advantage`): the built-in rules against their formulas written out by hand,
a user's rule by reference, checks on what a rule returns, their place in the batch, and the loss with
per-token advantages against the per-sequence one."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from learner.algo.advantages import group_advantages
from learner.algo.loss_rules import check_registered
from learner.algo.losses import LossConfig, normalizer_for, rl_loss
from learner.algo.policy_losses import resolve_policy_loss
from learner.algo.sequences import Sequences
from learner.algo.turn_advantages import (
    GroupTurnRewards,
    per_turn_grpo,
    resolve_turn_advantage,
    reward_to_go,
    trajectory,
    turn_advantages,
)
from learner.rl_loop import build_batch
from learner.service.group_validation import CompletionRecord, GroupRecord
from tandem_wire.turns import TurnRecord

PAD = 0
# Three trajectories of one group: per-turn rewards (they sum to 1, 0.5 and 0).
TURN_REWARDS = (np.array([0.0, 0.0, 1.0]), np.array([0.5]), np.array([0.0, 0.0]))


def _group(std_normalize: bool = True) -> GroupTurnRewards:
    totals = np.array([[r.sum() for r in TURN_REWARDS]])
    stats = group_advantages(totals, estimator="grpo" if std_normalize else "dr_grpo")
    return GroupTurnRewards(TURN_REWARDS, float(stats.baselines[0]), float(stats.scales[0]), 1e-4, std_normalize)


def test_trajectory_and_reward_to_go_follow_their_formulas():
    group = _group()
    b, s = 0.5, np.std([1.0, 0.5, 0.0], ddof=1) + 1e-4
    assert (group.baseline, group.scale) == pytest.approx((b, s))
    expected_trajectory = [np.full(3, (1 - b) / s), np.full(1, 0.0), np.full(2, (0 - b) / s)]
    for got, want in zip(trajectory(group), expected_trajectory, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-12)
    # the same numbers group_advantages gives each trajectory
    totals = np.array([[1.0, 0.5, 0.0]])
    np.testing.assert_allclose([a[0] for a in trajectory(group)], group_advantages(totals).advantages[0], rtol=1e-6)
    # reward-to-go: Σ_{k≥t} r_k, so a turn is not credited with what came before it
    expected_to_go = [(np.array([1.0, 1.0, 1.0]) - b) / s, np.array([0.0]), (np.array([0.0, 0.0]) - b) / s]
    for got, want in zip(reward_to_go(group), expected_to_go, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-12)
    rewards = (np.array([1.0, 0.0, 0.0]), np.array([0.0, 0.5]))  # the reward came early / late
    early = GroupTurnRewards(rewards, 0.75, 1.0, 1e-4, False)
    np.testing.assert_allclose(reward_to_go(early)[0], [0.25, -0.75, -0.75])
    np.testing.assert_allclose(reward_to_go(early)[1], [-0.25, -0.25])


def test_per_turn_grpo_normalises_each_turn_over_the_trajectories_that_reached_it():
    got = per_turn_grpo(_group())
    # turn 0: rewards [0, 0.5, 0] over 3 trajectories; turn 1: [0, 0] (no spread: 0); turn 2: one reached it
    turn0 = np.array([0.0, 0.5, 0.0])
    a0 = (turn0 - turn0.mean()) / (turn0.std(ddof=1) + 1e-4)
    np.testing.assert_allclose(got[0], [a0[0], 0.0, 0.0], rtol=1e-9)
    np.testing.assert_allclose(got[1], [a0[1]], rtol=1e-9)
    np.testing.assert_allclose(got[2], [a0[2], 0.0], rtol=1e-9)
    # without std_normalize the turn's rewards are only centred
    np.testing.assert_allclose(per_turn_grpo(_group(std_normalize=False))[1], [0.5 - 0.5 / 3])


def discounted(group: GroupTurnRewards) -> list[np.ndarray]:
    """A user's rule, named by reference below: reward-to-go with γ = 0.5."""
    out = []
    for rewards in group.turn_rewards:
        to_go = np.zeros(len(rewards))
        running = 0.0
        for t in range(len(rewards) - 1, -1, -1):
            running = rewards[t] + 0.5 * running
            to_go[t] = running
        out.append((to_go - group.baseline) / group.scale)
    return out


def test_a_users_rule_by_reference_and_what_a_rule_may_return():
    rule = resolve_turn_advantage("test_learner_turn_advantages:discounted")
    got = turn_advantages(rule, _group())
    b, s = _group().baseline, _group().scale
    np.testing.assert_allclose(got[0], (np.array([0.25, 0.5, 1.0]) - b) / s)
    assert resolve_turn_advantage("reward_to_go") is reward_to_go
    with pytest.raises(ValueError, match="unknown advantage 'nope'"):
        resolve_turn_advantage("nope")
    with pytest.raises(ValueError, match="2 trajectories' advantages for 3"):
        turn_advantages(lambda g: [np.zeros(3), np.zeros(1)], _group())
    with pytest.raises(ValueError, match="trajectory 2 .* need 2 finite numbers"):
        turn_advantages(lambda g: [np.zeros(3), np.zeros(1), np.array([0.0, np.nan])], _group())
    with pytest.raises(ValueError, match="trajectory 0 .* need 3 finite numbers"):
        turn_advantages(lambda g: [np.zeros(2), np.zeros(1), np.zeros(2)], _group())


def test_gspo_refuses_a_per_turn_rule():
    with pytest.raises(ValueError, match="sequence ratio takes one per sequence"):
        check_registered(LossConfig(algorithm="gspo", advantage="reward_to_go"))
    assert LossConfig(algorithm="gspo").advantage == "trajectory"


def _multi_turn_group(rewards: list[tuple[float, ...] | None]) -> GroupRecord:
    """One trajectory per entry: a turn of 2 sampled tokens then 1 observed per reward but the last
    (None: unscorable)."""
    completions = []
    for turn_rewards in rewards:
        n = len(turn_rewards or (0.0,))
        turns = [TurnRecord(2, 1 if k < n - 1 else 0, 0, (turn_rewards or (0.0,) * n)[k]) for k in range(n)]
        tokens = sum(t.sampled_tokens + t.observation_tokens for t in turns)
        mask = np.concatenate([[1, 1, 0] if t.observation_tokens else [1, 1] for t in turns])
        logprobs = list(np.where(mask == 1, -0.5, 0.0))
        reward = None if turn_rewards is None else float(sum(turn_rewards))
        completions.append(CompletionRecord(list(range(5, 5 + tokens)), logprobs, "stop", reward,
                                            None if reward is not None else "timeout", turns=turns))
    return GroupRecord(group_id="g", actor_id="a", policy_version=0, prompt_ids=[1, 3], completions=completions,
                       metadata={})


def _batch(group: GroupRecord, estimator: str = "dr_grpo"):
    """The group's batch as the RL loop builds it with reward-to-go, one sequence a row (rows of 8)."""
    return build_batch([group], LossConfig(estimator=estimator, advantage="reward_to_go"), reward_to_go, pad_id=PAD,
                       row_tokens=8, row_multiple=1, current_version=0)[0]


def test_the_batch_carries_each_turns_advantage_on_its_sampled_tokens():
    batch = _batch(_multi_turn_group([(0.0, 1.0), (0.0, 0.0), None]))
    # totals [1, 0] (the unscorable one is out): b = 0.5; reward-to-go of row 0 is [1, 1], of row 1 [0, 0]
    np.testing.assert_allclose(batch.advantages[0], [0, 0, 0.5, 0.5, 0, 0.5, 0.5, 0])
    np.testing.assert_allclose(batch.advantages[1], [0, 0, -0.5, -0.5, 0, -0.5, -0.5, 0])
    assert not batch.advantages[2].any()  # unscorable
    batch = _batch(_multi_turn_group([(1.0, 0.0), (0.0, 0.0)]))
    # row 0 earned its reward in turn 1: turn 2 gets only what followed it (0) less the baseline 0.5
    np.testing.assert_allclose(batch.advantages[0], [0, 0, 0.5, 0.5, 0, -0.5, -0.5, 0])
    even = _multi_turn_group([(0.0, 1.0), (1.0, 0.0)])  # equal totals: no signal, whatever the rule
    assert not _batch(even, estimator="grpo").advantages.any()


def test_the_loss_with_per_token_advantages():
    rng = np.random.default_rng(0)
    logps = jnp.asarray(rng.uniform(-3, -0.1, (3, 5)), jnp.float32)
    behaviour = logps + jnp.asarray(rng.normal(0, 0.3, (3, 5)), jnp.float32)
    mask = jnp.asarray([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [0, 1, 1, 1, 0]], jnp.float32)
    per_sequence = jnp.asarray([1.0, -0.5, 2.0])
    seqs = Sequences.of(jnp.ones((3, 5), jnp.int32))
    norm = normalizer_for(mask, seqs)
    config = LossConfig(epsilon_low=0.2, epsilon_high=0.28)
    loss_fn = resolve_policy_loss(config)

    def loss(advantages):
        return rl_loss(logps, behaviour, advantages, mask, seqs, config, norm, loss_fn)

    broadcast = jnp.broadcast_to(per_sequence[:, None], (3, 5))
    a, metrics_a = loss(per_sequence)
    b, metrics_b = loss(broadcast)
    assert float(a) == float(b) and metrics_a == metrics_b
    # per token: −min(ρ A_t, clip(ρ) A_t) summed over the mask / N_tok, written out
    per_token = jnp.asarray(rng.normal(0, 1, (3, 5)), jnp.float32)
    ratio = np.exp(np.asarray(logps - behaviour))
    adv = np.asarray(per_token)
    expected = -(np.minimum(ratio * adv, np.clip(ratio, 0.8, 1.28) * adv) * np.asarray(mask)).sum() / 11
    assert float(loss(per_token)[0]) == pytest.approx(expected, rel=1e-5)
    with pytest.raises(ValueError, match=r"advantages must be \[B\]"):
        loss(per_token[:, :2])

"""Advantage estimators: GRPO against tunix's, Dr.GRPO, RLOO and REINFORCE++-baseline against their papers'
formulas, unscorable completions, dynamic sampling, and a user's estimator by reference."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from tunix.rl.grpo import grpo_learner

from learner.algo.advantages import group_advantages, resolve_estimator


def test_equals_tunix_when_every_completion_is_scorable():
    rewards = np.random.default_rng(0).normal(size=(5, 4)).astype(np.float32)
    ours = group_advantages(rewards)
    theirs = grpo_learner.compute_advantages(jnp.asarray(rewards.reshape(-1)), num_generations=4)
    np.testing.assert_allclose(ours.advantages.reshape(-1), theirs, atol=1e-6)
    assert (ours.weights == 1).all()
    assert (ours.num_scorable, ours.num_unscorable, ours.num_zero_signal_groups) == (20, 0, 0)


def test_unscorable_completions_are_excluded_from_the_baseline_and_get_zero():
    rewards = np.array([[1.0, np.nan, 0.0, 0.5], [2.0, 1.0, 0.0, 3.0]])
    scorable = np.array([[True, True, True, True], [True, True, False, True]])  # 0.0 at [1, 2] is not real
    out = group_advantages(rewards, scorable, epsilon=0.0)
    for row, keep in enumerate([[0, 2, 3], [0, 1, 3]]):
        r = rewards[row, keep]
        np.testing.assert_allclose(out.advantages[row, keep], (r - r.mean()) / r.std(ddof=1), rtol=1e-6)
    assert out.advantages[0, 1] == 0.0 and out.advantages[1, 2] == 0.0
    np.testing.assert_array_equal(out.weights, [[1, 0, 1, 1], [1, 1, 0, 1]])
    assert (out.num_scorable, out.num_unscorable, out.num_zero_signal_groups) == (6, 2, 0)


def test_dr_grpo_does_not_divide_by_std():
    rewards = np.array([[1.0, 0.0, 0.0, 3.0]])
    out = group_advantages(rewards, estimator="dr_grpo")
    np.testing.assert_allclose(out.advantages, rewards - rewards.mean(), rtol=1e-6)


def test_rloo_subtracts_the_mean_of_the_other_completions():
    """RLOO (Ahmadian et al. 2024): A_j = R_j − (1/(n−1)) Σ_{k≠j} R_k over the scorable ones."""
    rewards = np.array([[1.0, 0.0, 0.5, 3.0], [2.0, np.nan, 0.0, 1.0]])
    out = group_advantages(rewards, estimator="rloo")
    for row in range(2):
        keep = np.flatnonzero(~np.isnan(rewards[row]))
        r = rewards[row, keep]
        others = np.array([np.delete(r, i).mean() for i in range(len(r))])
        np.testing.assert_allclose(out.advantages[row, keep], r - others, rtol=1e-12)
    assert out.advantages[1, 1] == 0.0 and out.weights[1, 1] == 0.0


def test_reinforce_pp_divides_the_group_centred_rewards_by_the_batch_std():
    """REINFORCE++-baseline (Hu et al. 2025): A = R − mean_group, then normalised by its std over the batch."""
    rewards = np.array([[1.0, 0.0, 0.0, 1.0], [0.5, 0.5, 0.5, 0.5], [3.0, 1.0, np.nan, 2.0]])
    out = group_advantages(rewards, estimator="reinforce_pp", epsilon=0.0)
    centred = rewards - np.nanmean(rewards, axis=1, keepdims=True)
    std = np.nanstd(centred, ddof=1)  # over every scorable completion of the batch, zero-signal groups included
    np.testing.assert_allclose(np.nan_to_num(out.advantages[~np.isnan(rewards)]),
                               (centred / std)[~np.isnan(rewards)], rtol=1e-12)
    assert (out.advantages[1] == 0).all() and out.num_zero_signal_groups == 1


@pytest.mark.parametrize("mode, dropped_weight", [("off", 1.0), ("count", 1.0), ("drop", 0.0)])
def test_zero_signal_groups(mode, dropped_weight):
    rewards = np.array([
        [1.0, 1.0, 1.0, 1.0],          # all equal: no signal
        [0.0, 1.0, 0.0, 1.0],          # signal
        [0.3, np.nan, np.nan, np.nan],  # one scorable completion: no baseline, no signal
        [0.7, np.nan, 0.7, 0.7],       # equal among the scorable ones
    ])
    out = group_advantages(rewards, dynamic_sampling=mode)
    assert out.num_zero_signal_groups == 3
    assert (out.advantages[[0, 2, 3]] == 0).all() and (out.advantages[1] != 0).all()
    np.testing.assert_array_equal(out.weights[0], dropped_weight)
    np.testing.assert_array_equal(out.weights[1], 1.0)
    np.testing.assert_array_equal(out.weights[2], [dropped_weight, 0, 0, 0])
    np.testing.assert_array_equal(out.weights[3], [dropped_weight, 0, dropped_weight, dropped_weight])


def test_bad_input_is_rejected():
    with pytest.raises(ValueError, match="num_groups, group_size"):
        group_advantages(np.zeros(4))
    with pytest.raises(ValueError, match="finite"):
        group_advantages(np.array([[1.0, np.inf]]))
    with pytest.raises(ValueError, match="scorable shape"):
        group_advantages(np.zeros((2, 2)), np.ones((2, 3), bool))
    with pytest.raises(ValueError, match="dynamic_sampling"):
        group_advantages(np.zeros((2, 2)), dynamic_sampling="sometimes")
    with pytest.raises(ValueError, match="unknown estimator"):
        group_advantages(np.zeros((2, 2)), estimator="ppo")


def test_a_users_estimator_by_reference():
    """`package.module:function`, registered nowhere: its advantages (R − the group's median) where the group
    has signal, 0 for unscorable completions and zero-signal groups; undecorated, it divides by no std."""
    ref = "tests.user_estimator:median_baseline"
    rewards = np.array([[0.0, 1.0, 1.0, 5.0], [2.0, 2.0, 2.0, 2.0], [np.nan, 3.0, 1.0, 0.0]])
    out = group_advantages(rewards, estimator=ref)
    np.testing.assert_allclose(out.advantages, [[-1, 0, 0, 4], [0, 0, 0, 0], [0, 2, 0, -1]])
    record = resolve_estimator(ref)
    assert not record.divides_by_std and record.group_baseline
    assert resolve_estimator("grpo").divides_by_std and not resolve_estimator("rloo").group_baseline

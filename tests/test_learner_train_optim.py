"""Optimizer: schedule values against their formulas, pre-clip grad norm, weight decay only on matrices."""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np
import optax
import pytest
from pydantic import ValidationError

from learner.algo.optim import OptimizerConfig, make_optimizer, make_schedule


def test_warmup_then_cosine_to_the_floor():
    config = OptimizerConfig(learning_rate=1e-3, warmup_steps=4, total_steps=20, min_lr_ratio=0.1)
    lr = make_schedule(config)
    # update k (1-based) of the warmup uses k/warmup of the peak: never a zero first step
    assert [float(lr(c)) for c in range(4)] == pytest.approx([2.5e-4, 5e-4, 7.5e-4, 1e-3])
    for count in (6, 12, 18):
        progress = (count + 1 - 4) / (20 - 4)
        expected = 1e-4 + (1e-3 - 1e-4) * 0.5 * (1 + math.cos(math.pi * progress))
        assert float(lr(count)) == pytest.approx(expected, rel=1e-5)
    assert float(lr(100)) == pytest.approx(1e-4)


def test_constant_schedule_with_and_without_warmup():
    lr = make_schedule(OptimizerConfig(learning_rate=2e-4, schedule="constant"))
    assert float(lr(0)) == float(lr(99)) == pytest.approx(2e-4)
    lr = make_schedule(OptimizerConfig(learning_rate=2e-4, schedule="constant", warmup_steps=2))
    assert [float(lr(c)) for c in (0, 1, 50)] == pytest.approx([1e-4, 2e-4, 2e-4])


def test_wsd_holds_the_peak_then_decays_over_its_last_fraction():
    config = OptimizerConfig(learning_rate=1e-3, schedule="wsd", total_steps=20, decay_fraction=0.25)
    lr = make_schedule(config)
    assert [float(lr(c)) for c in (0, 9, 15)] == pytest.approx([1e-3] * 3)
    for count in (15, 17, 19):  # cosine from the peak to the floor over the last 5 updates
        expected = 1e-4 + (1e-3 - 1e-4) * 0.5 * (1 + math.cos(math.pi * (count - 15) / 5))
        assert float(lr(count)) == pytest.approx(expected, rel=1e-5)
    assert float(lr(20)) == pytest.approx(1e-4) and float(lr(100)) == pytest.approx(1e-4)
    warm = make_schedule(config.model_copy(update={"warmup_steps": 2}))
    assert [float(warm(c)) for c in (0, 1, 10, 19)] == pytest.approx([5e-4, 1e-3, 1e-3, float(lr(20))], rel=1e-5)


def test_weight_decay_only_on_matrices():
    config = OptimizerConfig(learning_rate=0.1, weight_decay=0.5, schedule="constant")
    tx = make_optimizer(config)
    params = {"matrix": jnp.ones((2, 2)), "norm": jnp.ones((2,))}
    grads = {"matrix": jnp.zeros((2, 2)), "norm": jnp.zeros((2,))}
    updates, _ = tx.update(grads, tx.init(params), params)
    # zero gradients: only decoupled weight decay acts, on the matrix and not on the norm scale
    np.testing.assert_allclose(updates["matrix"], -0.1 * 0.5 * np.ones((2, 2)), rtol=1e-6)
    np.testing.assert_array_equal(updates["norm"], np.zeros(2))


def test_gradients_are_clipped_to_the_global_norm_before_adam():
    config = OptimizerConfig(learning_rate=0.1, max_grad_norm=1.0, schedule="constant")
    params = {"a": jnp.ones((3,)), "b": jnp.ones((2, 2))}
    steps = [{"a": jnp.full((3,), 60.0), "b": jnp.full((2, 2), -40.0)},  # norm ≈ 128: clipped
             {"a": jnp.full((3,), 0.1), "b": jnp.full((2, 2), 0.2)}]  # norm ≈ 0.46: kept
    oracle = optax.adamw(0.1, weight_decay=0.0)
    tx = make_optimizer(config)
    state, oracle_state = tx.init(params), oracle.init(params)
    for grads in steps:
        norm = float(optax.tree.norm(grads))
        clipped = {k: v * min(1.0, 1.0 / norm) for k, v in grads.items()}
        updates, state = tx.update(grads, state, params)
        expected, oracle_state = oracle.update(clipped, oracle_state, params)
        for k in params:
            np.testing.assert_allclose(updates[k], expected[k], rtol=1e-5)


def test_bad_config_is_rejected():
    with pytest.raises(ValidationError, match="warmup_steps"):
        OptimizerConfig(warmup_steps=10, total_steps=10)
    with pytest.raises(ValidationError):
        OptimizerConfig(learning_rate=-1.0)
    with pytest.raises(ValidationError):
        OptimizerConfig(lr=1e-3)  # unknown keys are errors, not silently ignored

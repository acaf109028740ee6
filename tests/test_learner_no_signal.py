"""Sparse rewards: steps without learning signal must not move AdamW (the collapse mechanism).

A run of all-zero-advantage batches followed by one batch with signal, on a tiny real model with
optax AdamW. Stepping Adam on zero gradients lets its moments decay while its step count grows, so
the one real gradient comes out as a sign-sized step several times lr, and momentum keeps pushing
for ~1/(1 − β1) more zero steps. Skipping the no-signal steps leaves Adam where it was: the signal
step is Adam's first update, lr · g/|g| per coordinate, and nothing follows it.
"""

from __future__ import annotations

import numpy as np
import pytest
from learner_train_helpers import host_leaves, random_rl_batch

from learner.algo.optim import OptimizerConfig
from learner.algo.train_step import Trainer
from models.jax_model import load_model, make_mesh

LR = 1e-3
B1, B2 = 0.9, 0.999
ZERO_BEFORE, ZERO_AFTER = 100, 20
OPTIMIZER = OptimizerConfig(learning_rate=LR, schedule="constant", b1=B1, b2=B2, max_grad_norm=None)


def adam_displacement_in_lr(zero_before: int, zero_after: int) -> float:
    """|Δθ| / lr of a coordinate whose only non-zero gradient comes at step zero_before + 1, after
    zero_after more zero-gradient steps: Σ_j m̂_j / √v̂_j with bias correction (ε negligible)."""
    total = 0.0
    for j in range(zero_after + 1):
        t = zero_before + 1 + j
        m_hat = (1 - B1) * B1**j / (1 - B1**t)
        v_hat = (1 - B2) * B2**j / (1 - B2**t)
        total += m_hat / np.sqrt(v_hat)
    return total


def _displacement(hf_dir, *, skip: bool) -> tuple[np.ndarray, Trainer, list[dict]]:
    mesh = make_mesh(1, 1)
    trainer = Trainer(load_model(hf_dir, mesh=mesh), mesh, OPTIMIZER, skip_no_signal=skip)
    signal = random_rl_batch()
    silent = signal._replace(advantages=np.zeros_like(signal.advantages))
    before = host_leaves(trainer.state.params)
    metrics = [trainer.rl_step(silent) for _ in range(ZERO_BEFORE)]
    metrics.append(trainer.rl_step(signal))
    metrics += [trainer.rl_step(silent) for _ in range(ZERO_AFTER)]
    after = host_leaves(trainer.state.params)
    moved = np.concatenate([np.abs(a - b).ravel() for a, b in zip(after, before, strict=True)])
    return moved, trainer, metrics


def test_expected_magnitudes():
    # The closed form at the extremes: Adam's first step is exactly lr; after a long silence one
    # gradient moves a coordinate by (1 − β1)/√(1 − β2) ≈ 3.16 lr, and its momentum ~10× that in all.
    assert adam_displacement_in_lr(0, 0) == pytest.approx(1.0)
    assert adam_displacement_in_lr(10**6, 0) == pytest.approx((1 - B1) / np.sqrt(1 - B2), rel=1e-6)
    assert adam_displacement_in_lr(10**6, 10**4) == pytest.approx(31.6, rel=0.01)


def test_skipping_no_signal_steps_removes_the_sign_sized_update(hf_dir):
    moved_skip, trainer_skip, metrics_skip = _displacement(hf_dir, skip=True)
    moved_step, trainer_step, metrics_step = _displacement(hf_dir, skip=False)

    # Skipping: AdamW saw exactly one update; zero-signal steps are reported as skipped.
    assert int(np.asarray(trainer_skip.state.step)) == 1
    assert sum(m["update_skipped"] for m in metrics_skip) == ZERO_BEFORE + ZERO_AFTER
    assert metrics_skip[ZERO_BEFORE]["update_skipped"] == 0.0
    assert int(np.asarray(trainer_step.state.step)) == ZERO_BEFORE + 1 + ZERO_AFTER

    # Coordinates the signal batch moved at all (the rest had a zero gradient in both runs).
    live = moved_skip > 1e-3 * LR
    assert live.mean() > 0.5
    expected_off = adam_displacement_in_lr(ZERO_BEFORE, ZERO_AFTER)
    assert expected_off > 8  # the analysis: an order of magnitude more than one Adam step
    # With skipping, the signal step is Adam's first: lr · g/(|g| + ε) ≤ lr, ≈ lr where |g| ≫ ε.
    assert moved_skip.max() <= LR * (1 + 1e-4)  # float32 rounding of θ ≈ 1 (norm scales): ~1e-7
    assert np.median(moved_skip[live]) == pytest.approx(LR, rel=1e-3)
    # Without skipping, the same gradient moves those coordinates by the closed form's amount.
    assert np.median(moved_step[live]) == pytest.approx(expected_off * LR, rel=0.02)
    assert np.median(moved_step[live] / moved_skip[live]) > 8

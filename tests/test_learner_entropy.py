"""The entropy bonus (`algo.entropy_coef`) against numpy's entropy of the same logits, in value and gradient;
its gradient raises the entropy; Skywork-OR1's adaptive coefficient (`algo.entropy_target`) step by step;
and train.stop_at_plateau's rule."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from learner.algo.entropy import EntropyControl
from learner.algo.logprobs import token_logprobs_and_entropy
from learner.algo.losses import LossConfig, normalizer_for, rl_loss
from learner.algo.policy_losses import resolve_policy_loss
from learner.algo.sequences import Sequences
from learner.schema import plateaued

B, T, V = 3, 6, 11
TEMPERATURE = 1.2
# two sequences packed in row 0, one in each other row; 0 = padding
SEGMENTS = np.array([[1, 1, 1, 2, 2, 0], [1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]], np.int32)
MASK = np.array([[0, 1, 1, 0, 1, 0], [0, 0, 1, 1, 1, 1], [0, 1, 1, 1, 0, 0]], np.float32)


def numpy_entropy(logits: np.ndarray) -> np.ndarray:
    """−Σ p log p of softmax(logits / T) over the last axis, in float64."""
    z = logits.astype(np.float64) / TEMPERATURE
    z = z - z.max(-1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
    return -(np.exp(logp) * logp).sum(-1)


def _case(seed: int = 0):
    rng = np.random.default_rng(seed)
    logits = rng.normal(0.0, 2.0, (B, T, V)).astype(np.float32)
    targets = rng.integers(0, V, (B, T))
    advantages = rng.normal(0.0, 1.0, (B,)).astype(np.float32)
    return logits, targets, advantages


def _loss(logits, targets, advantages, config: LossConfig, coef):
    logps, entropy = token_logprobs_and_entropy(logits / TEMPERATURE, targets)
    sequences = Sequences.of(jnp.asarray(SEGMENTS))
    loss, metrics = rl_loss(logps, jax.lax.stop_gradient(logps), advantages, MASK, sequences, config,
                            normalizer_for(MASK, sequences), resolve_policy_loss(config), entropy=entropy,
                            entropy_coef=coef)
    return loss, metrics


def _per_row_segments_aggregate(per_token: np.ndarray, aggregation: str) -> float:
    """numpy aggregate over packed sequences, each (row, segment id) pair its own sequence."""
    if aggregation == "token-mean":
        return float((per_token * MASK).sum() / MASK.sum())
    means = []
    for row in range(B):
        for s in sorted(set(SEGMENTS[row]) - {0}):
            where = SEGMENTS[row] == s
            if MASK[row][where].sum():
                means.append((per_token[row] * MASK[row])[where].sum() / MASK[row][where].sum())
    return float(np.mean(means))


@pytest.mark.parametrize("aggregation", ["token-mean", "seq-mean-token-mean"])
def test_the_bonus_is_minus_alpha_times_numpys_entropy_aggregated_as_the_loss(aggregation):
    logits, targets, advantages = _case()
    config = LossConfig(aggregation=aggregation, entropy_coef=0.03)
    alpha = jnp.float32(0.03)
    with_bonus, metrics = _loss(logits, targets, advantages, config, alpha)
    without, _ = _loss(logits, targets, advantages, config, 0.0)
    expected = _per_row_segments_aggregate(numpy_entropy(logits), aggregation)
    assert float(with_bonus - without) == pytest.approx(-0.03 * expected, rel=1e-5)
    # the logged entropy is the token mean of the same numbers
    assert float(metrics["entropy"]) == pytest.approx(_per_row_segments_aggregate(numpy_entropy(logits),
                                                                                  "token-mean"), rel=1e-5)


def test_the_bonus_gradient_is_minus_alpha_times_numpys_entropy_gradient():
    """With zero advantages the loss is −α·H̄ alone: its gradient in the logits equals a central finite
    difference of numpy's token-mean entropy."""
    logits, targets, _ = _case(1)
    config, alpha = LossConfig(entropy_coef=0.5), 0.5
    grad = np.asarray(jax.grad(lambda x: _loss(x, targets, np.zeros(B, np.float32), config,
                                               jnp.float32(alpha))[0])(jnp.asarray(logits)))
    masked = np.argwhere(MASK > 0)
    rng = np.random.default_rng(2)
    for i, t in masked[rng.choice(len(masked), 6, replace=False)]:
        v = rng.integers(V)
        h, up, down = 1e-4, logits.astype(np.float64).copy(), logits.astype(np.float64).copy()
        up[i, t, v] += h
        down[i, t, v] -= h
        fd = -alpha * (_per_row_segments_aggregate(numpy_entropy(up), "token-mean")
                       - _per_row_segments_aggregate(numpy_entropy(down), "token-mean")) / (2 * h)
        assert grad[i, t, v] == pytest.approx(fd, rel=1e-3, abs=1e-6)


def test_one_sgd_step_on_the_bonus_raises_the_entropy_of_a_toy_policy():
    """A toy policy (logits = x @ W) whose groups carry no signal (A = 0): one SGD step on the loss with
    the bonus raises its entropy; without the bonus the loss has no gradient."""
    rng = np.random.default_rng(3)
    x = jnp.asarray(rng.normal(0.0, 1.0, (B, T, 5)).astype(np.float32))
    w = jnp.asarray(rng.normal(0.0, 3.0, (5, V)).astype(np.float32))  # a peaked (low-entropy) start
    _, targets, _ = _case(3)
    zero_advantages = np.zeros(B, np.float32)

    def loss(w, coef):
        return _loss(x @ w, targets, zero_advantages, LossConfig(entropy_coef=0.1), coef)[0]

    def entropy(w):
        return _per_row_segments_aggregate(numpy_entropy(np.asarray(x @ w)), "token-mean")

    stepped = w - 1.0 * jax.grad(loss)(w, jnp.float32(0.1))
    assert entropy(stepped) > entropy(w) + 1e-3
    assert float(jnp.abs(jax.grad(loss)(w, 0.0)).max()) == 0.0


def test_the_adaptive_coefficient_follows_skywork_or1s_rule():
    """c rises by Δ while the entropy is below the target and falls by Δ (not below 0) while above; the
    bonus applies only while the last entropy is at most the target."""
    control = EntropyControl(LossConfig(entropy_target=0.3, entropy_coef_step=0.01))
    coefs = []
    for entropy in [0.1, 0.1, 0.2, 0.5, 0.2, 0.3, 0.6, 0.6, 0.6]:
        coefs.append(control.coef)
        control.observe(entropy)
    # c:    0, .01, .02, .03, .02, .03, .03, .02, .01 (then 0); the bonus off after entropies above 0.3
    np.testing.assert_allclose(coefs, [0.0, 0.01, 0.02, 0.03, 0.0, 0.03, 0.03, 0.0, 0.0], atol=1e-12)
    for _ in range(5):
        control.observe(0.9)
    assert control.c == 0.0
    fixed = EntropyControl(LossConfig(entropy_coef=0.02))
    fixed.observe(5.0)
    assert fixed.coef == 0.02


@pytest.mark.parametrize("kwargs, match", [({"entropy_coef": -0.1}, "entropy_coef"),
                                           ({"entropy_coef_step": 0.0}, "entropy_coef_step"),
                                           ({"entropy_target": 0.0}, "entropy_target")])
def test_entropy_settings_reject_bad_values(kwargs, match):
    with pytest.raises(ValueError, match=match):
        LossConfig(**kwargs)


def test_the_plateau_rule_counts_evaluations_since_the_best():
    assert not plateaued([0.1, 0.2, 0.3], 3)  # no best before the last three yet
    assert not plateaued([0.1, 0.5, 0.4, 0.6, 0.6], 3)  # 0.6 beat 0.5 within the last three
    assert plateaued([0.1, 0.6, 0.5, 0.6, 0.55], 3)  # equalling the best is no improvement
    assert plateaued([0.9, 0.2, 0.3], 2)
    assert not plateaued([0.9, 0.2, 0.95], 2)

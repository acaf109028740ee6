"""GRPO / GSPO / GSPO-token losses against tunix 0.1.5 and against the papers' formulas in numpy."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from test_learner_tiny_model import EOS_ID, PAD_ID, make_batch, tiny_qwen2
from tunix.rl import common as tunix_common
from tunix.rl.grpo import dapo_learner, grpo_learner

from learner.algo.logprobs import per_token_logprobs
from learner.algo.losses import (
    AGGREGATIONS,
    LossConfig,
    Normalizer,
    aggregate,
    k3_kl,
    normalizer_for,
    policy_loss,
    tis_weights,
)

VOCAB = 40


# ---------------------------------------------------------------------------------------------
# Equality with tunix's grpo_loss_fn (loss and gradients w.r.t. the model parameters)


@pytest.fixture(scope="module")
def tunix_case():
    """A tiny model, a batch, and behaviour/reference logprobs that differ from the policy's."""
    model = tiny_qwen2(vocab_size=VOCAB, seed=5)
    batch = make_batch(4, 5, 7, VOCAB, seed=2)
    current = tunix_common.compute_per_token_logps(
        model, jnp.asarray(batch.prompt_ids), jnp.asarray(batch.completion_ids), pad_id=PAD_ID, eos_id=EOS_ID
    )
    rng = np.random.default_rng(7)
    advantages = np.array([1.3, -0.7, 0.4, -1.1], np.float32)
    # Per-sequence shifts put sequence 0 above 1 + ε_high (A > 0) and sequence 1 below 1 − ε_low
    # (A < 0), token noise spreads the rest: both clip branches are exercised, at both levels.
    shift = np.array([-0.5, 0.5, 0.0, 0.0], np.float32)[:, None]
    old = np.asarray(current) + shift + rng.normal(0.0, 0.2, current.shape).astype(np.float32)
    ref = np.asarray(current) + rng.normal(0.0, 0.3, current.shape).astype(np.float32)
    return model, batch, old, ref, advantages


def _tunix_loss_and_grads(model, batch, old, ref, advantages, loss_algo, agg):
    # DAPOConfig is GRPOConfig plus epsilon_high (GRPOConfig has slots, so it cannot be added).
    config = dapo_learner.DAPOConfig(
        loss_algo=loss_algo, loss_agg_mode=agg, beta=0.04, epsilon=0.2, epsilon_high=0.28, num_generations=2
    )
    example = grpo_learner.TrainExample(
        prompt_ids=jnp.asarray(batch.prompt_ids), prompt_mask=jnp.asarray(batch.prompt_mask),
        completion_ids=jnp.asarray(batch.completion_ids), completion_mask=jnp.asarray(batch.completion_mask),
        advantages=jnp.asarray(advantages), ref_per_token_logps=jnp.asarray(ref),
        old_per_token_logps=jnp.asarray(old),
    )

    def loss_fn(m):
        return grpo_learner.grpo_loss_fn(m, example, config, PAD_ID, EOS_ID)

    (loss, aux), grads = nnx.value_and_grad(loss_fn, has_aux=True)(model)
    return loss, aux["kl"], grads


def _our_loss_and_grads(model, batch, old, ref, advantages, algorithm, agg):
    config = LossConfig(algorithm=algorithm, epsilon_low=0.2, epsilon_high=0.28, beta=0.04, aggregation=agg)
    mask = jnp.asarray(batch.completion_mask, jnp.float32)
    norm = normalizer_for(mask)
    prompt_len = batch.prompt_ids.shape[1]

    def loss_fn(m):
        logps, _ = per_token_logprobs(
            m, jnp.asarray(batch.input_ids), jnp.asarray(batch.attention_mask), chunk_tokens=3
        )
        return policy_loss(
            logps[:, prompt_len - 1:], jnp.asarray(old), jnp.asarray(advantages), mask, config, norm,
            ref_logps=jnp.asarray(ref),
        )

    (loss, metrics), grads = nnx.value_and_grad(loss_fn, has_aux=True)(model)
    return loss, metrics, grads


@pytest.mark.parametrize(
    "tunix_algo, ours, tunix_agg, our_agg",
    [
        ("grpo", "grpo", "token-mean", "token-mean"),
        ("grpo", "grpo", "sequence-mean-token-mean", "seq-mean-token-mean"),
        ("gspo-token", "gspo-token", "sequence-mean-token-mean", "seq-mean-token-mean"),
        ("gspo-token", "gspo-token", "token-mean", "token-mean"),
    ],
)
def test_loss_and_gradients_equal_tunix(tunix_case, tunix_algo, ours, tunix_agg, our_agg):
    model, batch, old, ref, advantages = tunix_case
    t_loss, t_kl, t_grads = _tunix_loss_and_grads(model, batch, old, ref, advantages, tunix_algo, tunix_agg)
    loss, metrics, grads = _our_loss_and_grads(model, batch, old, ref, advantages, ours, our_agg)
    np.testing.assert_allclose(loss, t_loss, atol=1e-6, rtol=0)
    np.testing.assert_allclose(metrics["kl"], t_kl, atol=1e-6, rtol=0)
    t_leaves, leaves = jax.tree.leaves(t_grads), jax.tree.leaves(grads)
    assert len(t_leaves) == len(leaves) > 0
    for t_g, g in zip(t_leaves, leaves, strict=True):
        np.testing.assert_allclose(g, t_g, atol=1e-6, rtol=1e-5)
    assert max(float(jnp.abs(g).max()) for g in leaves) > 1e-3  # the gradients are not trivially zero
    assert float(metrics["clip_frac_low"]) > 0 and float(metrics["clip_frac_high"]) > 0


# ---------------------------------------------------------------------------------------------
# Formulas in numpy


def _case(seed=0, b=6, t=8):
    rng = np.random.default_rng(seed)
    logps = -rng.uniform(0.1, 3.0, (b, t)).astype(np.float32)
    # Token noise plus a per-sequence shift, so token and sequence ratios both leave the clip range.
    old = (logps + rng.normal(0, 0.3, (b, 1)) + rng.normal(0, 0.3, (b, t))).astype(np.float32)
    ref = (logps + rng.normal(0, 0.3, (b, t))).astype(np.float32)
    lens = rng.integers(1, t + 1, b)
    lens[0] = t
    mask = (np.arange(t)[None] < lens[:, None]).astype(np.float32)
    adv = rng.normal(0, 1, b).astype(np.float32)
    return logps, old, ref, mask, adv


def _np_aggregate(per_token, mask, mode, const=None):
    sums = (per_token * mask).sum(1)
    n_seq = (mask.sum(1) > 0).sum()
    if mode == "token-mean":
        return sums.sum() / mask.sum()
    if mode == "seq-mean-token-mean":
        return (sums / np.maximum(mask.sum(1), 1)).sum() / n_seq
    if mode == "seq-mean-token-sum":
        return sums.sum() / n_seq
    return sums.sum() / (n_seq * const)


def test_k3_matches_formula_and_is_nonnegative():
    logps, _, ref, _, _ = _case()
    r = ref.astype(np.float64) - logps
    np.testing.assert_allclose(k3_kl(jnp.asarray(logps), jnp.asarray(ref)), np.exp(r) - r - 1, atol=1e-6)
    assert float(k3_kl(jnp.asarray(logps), jnp.asarray(ref)).min()) >= 0.0
    np.testing.assert_allclose(k3_kl(jnp.asarray(logps), jnp.asarray(logps)), 0.0)


def test_gspo_sequence_level_matches_paper():
    """GSPO: s_i = exp(mean_t log(π_θ/π_old)); loss_i = −min(s_i A_i, clip(s_i) A_i); mean over i."""
    logps, old, _, mask, adv = _case(seed=1)
    eps_low, eps_high = 0.2, 0.25
    s = np.exp(((logps - old) * mask).sum(1) / mask.sum(1))
    per_seq = -np.minimum(s * adv, np.clip(s, 1 - eps_low, 1 + eps_high) * adv)
    expected = per_seq.mean()
    config = LossConfig(
        algorithm="gspo", epsilon_low=eps_low, epsilon_high=eps_high, aggregation="seq-mean-token-mean"
    )
    loss, metrics = policy_loss(
        jnp.asarray(logps), jnp.asarray(old), jnp.asarray(adv), jnp.asarray(mask), config,
        normalizer_for(mask),
    )
    np.testing.assert_allclose(loss, expected, atol=1e-6)
    assert (s < 1 - eps_low).any() or (s > 1 + eps_high).any()  # the clip matters in this case
    # Its gradient w.r.t. token t of sequence i: −A_i s_i / |o_i| / N when unclipped, 0 when clipped.
    grad = jax.grad(
        lambda lp: policy_loss(lp, jnp.asarray(old), jnp.asarray(adv), jnp.asarray(mask), config,
                               normalizer_for(mask))[0]
    )(jnp.asarray(logps))
    clipped = np.where(adv > 0, s > 1 + eps_high, s < 1 - eps_low)
    expected_grad = np.where(clipped, 0.0, -adv * s / mask.sum(1))[:, None] * mask / len(adv)
    np.testing.assert_allclose(grad, expected_grad, atol=1e-6)
    assert float(metrics["ratio_mean"]) == pytest.approx((s[:, None] * mask).sum() / mask.sum(), abs=1e-6)


def test_gspo_token_has_sequence_value_and_token_gradient():
    """GSPO-token: s_it = sg[s_i] π_θ(y_t)/sg[π_θ(y_t)]; same value as GSPO, per-token gradient."""
    logps, old, _, mask, adv = _case(seed=2)
    norm = normalizer_for(mask)
    wide = dict(epsilon_low=0.9, epsilon_high=10.0, aggregation="seq-mean-token-mean")  # nothing clipped

    def loss(algorithm, lp):
        return policy_loss(lp, jnp.asarray(old), jnp.asarray(adv), jnp.asarray(mask),
                           LossConfig(algorithm=algorithm, **wide), norm)[0]

    lp = jnp.asarray(logps)
    np.testing.assert_allclose(loss("gspo-token", lp), loss("gspo", lp), atol=1e-6)
    s = np.exp(((logps - old) * mask).sum(1) / mask.sum(1))
    # d/dlogp_it of −(1/N) Σ_i (1/|o_i|) Σ_t s_it A_i = −A_i s_i / (N |o_i|): with per-sequence
    # advantages GSPO-token equals GSPO in value and gradient (the paper's remark).
    g = jax.grad(lambda x: loss("gspo-token", x))(lp)
    np.testing.assert_allclose(g, (-adv * s / mask.sum(1))[:, None] * mask / len(adv), atol=1e-6)


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
def test_grpo_aggregations_match_numpy(aggregation):
    logps, old, ref, mask, adv = _case(seed=3)
    eps_low, eps_high, beta, const = 0.2, 0.28, 0.05, 16.0
    r = np.exp(logps - old)
    pg = -np.minimum(r * adv[:, None], np.clip(r, 1 - eps_low, 1 + eps_high) * adv[:, None])
    kl = np.exp(ref - logps) - (ref - logps) - 1
    expected = _np_aggregate(pg + beta * kl, mask, aggregation, const)
    config = LossConfig(epsilon_low=eps_low, epsilon_high=eps_high, beta=beta, aggregation=aggregation,
                        constant_normalizer=const)
    loss, metrics = policy_loss(
        jnp.asarray(logps), jnp.asarray(old), jnp.asarray(adv), jnp.asarray(mask), config,
        normalizer_for(mask), ref_logps=jnp.asarray(ref), entropy=jnp.ones_like(logps) * 2.0,
    )
    np.testing.assert_allclose(loss, expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(metrics["policy_loss"], _np_aggregate(pg, mask, aggregation, const), rtol=1e-5)
    np.testing.assert_allclose(metrics["kl"], (kl * mask).sum() / mask.sum(), rtol=1e-5)
    low = ((r < 1 - eps_low) & (adv[:, None] < 0)) * mask
    high = ((r > 1 + eps_high) & (adv[:, None] > 0)) * mask
    np.testing.assert_allclose(metrics["clip_frac_low"], low.sum() / mask.sum(), atol=1e-6)
    np.testing.assert_allclose(metrics["clip_frac_high"], high.sum() / mask.sum(), atol=1e-6)
    assert low.sum() > 0 and high.sum() > 0
    np.testing.assert_allclose(metrics["entropy"], 2.0, atol=1e-6)


def test_aggregate_rejects_unknown_mode_and_ignores_empty_rows():
    per_token = jnp.ones((3, 4))
    mask = jnp.asarray([[1, 1, 0, 0], [0, 0, 0, 0], [1, 1, 1, 1]], jnp.float32)  # row 1 is padding
    norm = normalizer_for(mask)
    assert float(norm.num_tokens) == 6 and float(norm.num_sequences) == 2
    assert float(aggregate(per_token, mask, norm, "seq-mean-token-mean")) == pytest.approx(1.0)
    assert float(aggregate(per_token, mask, norm, "seq-mean-token-sum")) == pytest.approx(3.0)
    with pytest.raises(ValueError, match="aggregation"):
        aggregate(per_token, mask, norm, "sum")


# ---------------------------------------------------------------------------------------------
# Micro-batch accumulation


@pytest.mark.parametrize("algorithm", ["grpo", "gspo", "gspo-token"])
@pytest.mark.parametrize("aggregation", AGGREGATIONS)
def test_micro_batches_sum_to_full_batch(algorithm, aggregation):
    """Σ over micro-batches of (loss, grad, metrics) with global normalisers == full-batch values."""
    logps, old, ref, mask, adv = _case(seed=4, b=8)
    mask[5] = 0.0  # an empty (padding) row must not count as a sequence anywhere
    config = LossConfig(algorithm=algorithm, beta=0.02, aggregation=aggregation, constant_normalizer=8.0,
                        epsilon_high=0.28, tis_cap=2.0)
    norm = normalizer_for(mask)

    def run(sl, normalizer):
        def f(lp):
            return policy_loss(lp, jnp.asarray(old[sl]), jnp.asarray(adv[sl]), jnp.asarray(mask[sl]), config,
                               normalizer, ref_logps=jnp.asarray(ref[sl]),
                               learner_old_logps=jnp.asarray(old[sl] + 0.1))
        (loss, metrics), grad = jax.value_and_grad(f, has_aux=True)(jnp.asarray(logps[sl]))
        return loss, metrics, grad

    full_loss, full_metrics, full_grad = run(slice(None), norm)
    parts = [run(slice(i, i + 3), norm) for i in range(0, 8, 3)]  # uneven micro-batches: 3, 3, 2
    np.testing.assert_allclose(sum(p[0] for p in parts), full_loss, atol=1e-6)
    np.testing.assert_allclose(np.concatenate([p[2] for p in parts]), full_grad, atol=1e-6)
    for key, value in full_metrics.items():
        np.testing.assert_allclose(sum(p[1][key] for p in parts), value, atol=1e-6, err_msg=key)
    # A micro-batch normalised by itself would give a different answer (the test can fail).
    own = [run(slice(i, i + 3), normalizer_for(mask[i:i + 3]))[0] for i in range(0, 8, 3)]
    assert abs(float(sum(own)) - float(full_loss)) > 1e-4


# ---------------------------------------------------------------------------------------------
# Truncated importance sampling


def test_tis_weights_are_capped_and_stop_gradient():
    learner_old = jnp.asarray([0.0, -1.0, -2.0, -0.1])
    behaviour = jnp.asarray([-3.0, -1.0, -1.0, -0.2])
    w = tis_weights(learner_old, behaviour, cap=2.0)
    np.testing.assert_allclose(w, [2.0, 1.0, np.exp(-1.0), np.exp(0.1)], rtol=1e-6)
    assert float(jax.grad(lambda x: tis_weights(x, behaviour, 2.0).sum())(learner_old).sum()) == 0.0


def test_tis_loss_uses_learner_ratio_and_capped_weights():
    logps, behaviour, _, mask, adv = _case(seed=5)
    learner_old = (logps + np.random.default_rng(1).normal(0, 0.1, logps.shape)).astype(np.float32)
    cap = 1.5
    w = np.minimum(np.exp(learner_old - behaviour), cap)
    r = np.exp(logps - learner_old)
    pg = -np.minimum(r * adv[:, None], np.clip(r, 0.8, 1.2) * adv[:, None]) * w
    config = LossConfig(tis_cap=cap)
    loss, metrics = policy_loss(
        jnp.asarray(logps), jnp.asarray(behaviour), jnp.asarray(adv), jnp.asarray(mask), config,
        normalizer_for(mask), learner_old_logps=jnp.asarray(learner_old),
    )
    np.testing.assert_allclose(loss, (pg * mask).sum() / mask.sum(), rtol=1e-5)
    np.testing.assert_allclose(metrics["tis_weight_mean"], (w * mask).sum() / mask.sum(), rtol=1e-5)
    np.testing.assert_allclose(metrics["behaviour_gap"], (np.abs(logps - behaviour) * mask).sum() / mask.sum(),
                               rtol=1e-5)
    assert (np.exp(learner_old - behaviour) > cap).any()  # the cap is active in this case
    # Without learner_old_logps the learner's π_old is sg[π_θ]: ratio 1, weight min(π_θ/π_behaviour, C).
    loss_default, _ = policy_loss(
        jnp.asarray(logps), jnp.asarray(behaviour), jnp.asarray(adv), jnp.asarray(mask), config,
        normalizer_for(mask),
    )
    w0 = np.minimum(np.exp(logps - behaviour), cap)
    np.testing.assert_allclose(loss_default, (-adv[:, None] * w0 * mask).sum() / mask.sum(), rtol=1e-5)


# ---------------------------------------------------------------------------------------------
# Configuration and argument errors


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"algorithm": "ppo"}, "algorithm"),
        ({"aggregation": "sum"}, "aggregation"),
        ({"aggregation": "constant"}, "constant_normalizer"),
        ({"dynamic_sampling": "yes"}, "dynamic_sampling"),
        ({"epsilon_low": 1.0}, "epsilon"),
        ({"beta": -0.1}, "beta"),
        ({"tis_cap": 0.0}, "tis_cap"),
    ],
)
def test_loss_config_rejects_bad_values(kwargs, match):
    with pytest.raises(ValueError, match=match):
        LossConfig(**kwargs)


def test_policy_loss_argument_errors():
    logps, old, _, mask, adv = _case()
    norm = Normalizer(jnp.asarray(mask.sum()), jnp.asarray(float(len(adv))))
    with pytest.raises(ValueError, match="ref_logps"):
        policy_loss(jnp.asarray(logps), jnp.asarray(old), jnp.asarray(adv), jnp.asarray(mask),
                    LossConfig(beta=0.1), norm)
    with pytest.raises(ValueError, match="advantages"):
        policy_loss(jnp.asarray(logps), jnp.asarray(old), jnp.asarray(adv[:-1]), jnp.asarray(mask),
                    LossConfig(), norm)
    assert dataclasses.is_dataclass(LossConfig) and LossConfig().beta == 0.0

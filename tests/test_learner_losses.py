"""The RL loss against tunix 0.1.5 (GRPO, GSPO-token) and against the papers' formulas written in numpy,
independently of the code: every policy loss, off-policy correction and aggregation, values and gradients,
on rows that pack several sequences."""

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

from learner.algo.advantages import estimator
from learner.algo.logprobs import per_token_logprobs
from learner.algo.loss_rules import check_registered
from learner.algo.losses import AGGREGATIONS, LossConfig, Normalizer, aggregate, k3_kl, normalizer_for, rl_loss
from learner.algo.policy_losses import policy_loss, resolve_policy_loss
from learner.algo.sequences import Sequences
from learner.schema import GeometricSequenceMask, IcePop, OffPolicySequenceMask, SequenceTIS, TokenMask, TokenTIS

VOCAB = 40


def one_per_row(mask) -> Sequences:
    """Sequences of an unpacked [B, T] batch: each row is one."""
    return Sequences.of(jnp.ones(np.shape(mask), jnp.int32))


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
    seqs = one_per_row(mask)
    norm = normalizer_for(mask, seqs)
    prompt_len = batch.prompt_ids.shape[1]

    def loss_fn(m):
        logps, _ = per_token_logprobs(
            m, jnp.asarray(batch.input_ids), jnp.asarray(batch.attention_mask), chunk_tokens=3
        )
        return rl_loss(logps[:, prompt_len - 1:], jnp.asarray(old), jnp.asarray(advantages), mask, seqs, config,
                       norm, resolve_policy_loss(config), ref_logps=jnp.asarray(ref))

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
# The papers' formulas in numpy, on packed rows: row 0 holds sequences 1 and 2, row 1 one sequence and
# padding, row 2 three short ones.

SEGMENTS = np.array([[1, 1, 1, 1, 2, 2, 2, 2, 2, 2],
                     [1, 1, 1, 1, 1, 1, 1, 0, 0, 0],
                     [1, 1, 1, 2, 2, 2, 3, 3, 3, 3]], np.int32)


def _case(seed=0, segments=SEGMENTS):
    """logps, old (the learner's pre-update), behaviour, ref, mask, advantages (one per sequence, on its
    tokens), all float64, in a packed layout: each sequence's first token is a prompt token (mask 0)."""
    rng = np.random.default_rng(seed)
    shape = segments.shape
    first = np.concatenate([np.ones((shape[0], 1), bool), segments[:, 1:] != segments[:, :-1]], axis=1)
    mask = ((segments > 0) & ~first).astype(np.float64)
    logps = -rng.uniform(0.1, 3.0, shape)
    seq_shift = rng.normal(0, 0.3, (shape[0], segments.max() + 1))
    shift = np.take_along_axis(seq_shift, segments, axis=1)
    # Token noise plus a per-sequence shift, so token and sequence ratios both leave the clip range.
    old = logps + 0.5 * rng.normal(0, 0.2, shape)
    behaviour = old + shift + rng.normal(0, 0.3, shape)
    ref = logps + rng.normal(0, 0.3, shape)
    seq_adv = rng.normal(0, 1, (shape[0], segments.max() + 1))
    adv = np.take_along_axis(seq_adv, segments, axis=1) * (segments > 0)
    return logps, old, behaviour, ref, mask, adv


def _sequences_np(segments):
    """[(row, columns)] of each sequence."""
    return [(r, np.flatnonzero(segments[r] == s)) for r in range(len(segments)) for s in np.unique(segments[r]) if s]


def _seq_mean(x, mask, segments=SEGMENTS):
    out = np.zeros_like(x)
    for r, cols in _sequences_np(segments):
        out[r, cols] = (x[r, cols] * mask[r, cols]).sum() / max(mask[r, cols].sum(), 1)
    return out


def _seq_sum(x, segments=SEGMENTS):
    out = np.zeros_like(x)
    for r, cols in _sequences_np(segments):
        out[r, cols] = x[r, cols].sum()
    return out


def _np_aggregate(per_token, mask, mode, const=None, segments=SEGMENTS):
    seqs = [(r, cols) for r, cols in _sequences_np(segments) if mask[r, cols].sum() > 0]
    sums = np.array([(per_token[r, cols] * mask[r, cols]).sum() for r, cols in seqs])
    lens = np.array([mask[r, cols].sum() for r, cols in seqs])
    if mode == "token-mean":
        return sums.sum() / mask.sum()
    if mode == "seq-mean-token-mean":
        return (sums / lens).sum() / len(seqs)
    if mode == "seq-mean-token-sum":
        return sums.sum() / len(seqs)
    return sums.sum() / (len(seqs) * const)


def _clip_loss(r, adv, lo, hi):
    return -np.minimum(r * adv, np.clip(r, 1 - lo, 1 + hi) * adv)


EPS = (0.2, 0.28)


def np_policy_loss(name, lp, old, behaviour, adv, mask, proximal, cap=5.0):
    """ℓ per token, from the papers (notation of learner.algo.policy_losses)."""
    lo, hi = EPS
    if name == "grpo":
        return _clip_loss(np.exp(lp - proximal), adv, lo, hi)
    if name in ("gspo", "gspo-token"):  # the same value; gspo-token differs in its gradient only
        return _clip_loss(np.exp(_seq_mean(lp - proximal, mask)), adv, lo, hi)
    if name == "cispo":
        return -np.clip(np.exp(lp - proximal), 1 - lo, 1 + hi) * adv * lp
    if name == "decoupled_ppo":
        w = np.exp(old - behaviour)
        return (w <= cap) * w * _clip_loss(np.exp(lp - old), adv, lo, hi)
    raise AssertionError(name)


def np_correction(c, old, behaviour, adv, mask, current=None):
    """(weights, keep) per token; `current` is π_θ's logprobs (default: π_old's, a batch's first update).

    IcePop (Ring-1T, arXiv 2510.18855): M(k) = k if α ≤ k ≤ β else 0, k = π_train/π_infer = π_old/μ.
    DeepSeek-V3.2 (arXiv 2512.02556): M_i = 0 if Â_i < 0 and (1/|o_i|) Σ_t log(μ(o_t)/π_θ(o_t)) > δ, else 1,
    μ the policy that sampled o_i."""
    current = old if current is None else current
    log_rho = old - behaviour
    rho = np.exp(log_rho)
    ones = np.ones_like(rho)
    if c is None:
        return ones, ones
    if c.kind == "token_tis":
        return np.minimum(rho, c.cap), ones
    if c.kind == "icepop":
        return np.where((c.low <= rho) & (rho <= c.high), rho, 0.0), ones
    if c.kind == "token_mask":
        return ones, ((rho >= c.low) & (rho <= c.high)).astype(float)
    if c.kind == "seq_mask_geo":
        g = np.exp(_seq_mean(log_rho, mask))
        return ones, ((g >= c.low) & (g <= c.high)).astype(float)
    if c.kind == "seq_tis":
        return np.minimum(np.exp(_seq_sum(log_rho * mask)), c.cap), ones
    if c.kind == "offpolicy_seq_mask":
        kl = _seq_mean(behaviour - current, mask)
        return ones, 1.0 - ((adv < 0) & (kl > c.delta)).astype(float)
    raise AssertionError(c)


# The clip rule: a correction that reweights by π_old/μ is the decoupled form (clip π_θ/π_old, as IcePop's
# and TIS's objectives); a mask alone, or nothing, clips π_θ/μ (DeepSeek-V3.2's objective, PPO on μ).
REWEIGHTING = ("token_tis", "icepop", "seq_tis")


def np_proximal(c, old, behaviour):
    return old if c is not None and c.kind in REWEIGHTING else behaviour


def ours(config, lp, old, behaviour, adv, mask, ref=None, *, given_old=True, segments=SEGMENTS):
    """(loss, metrics) of rl_loss on numpy inputs (float64 when x64 is on)."""
    j = jnp.asarray
    seqs = Sequences.of(j(segments))
    return rl_loss(j(lp), j(behaviour), j(adv), j(mask), seqs, config, normalizer_for(j(mask), seqs),
                   resolve_policy_loss(config), old_logps=j(old) if given_old else None,
                   ref_logps=None if ref is None else j(ref))


def finite_difference(f, x, h=1e-6):
    grad = np.zeros_like(x)
    for index in np.ndindex(x.shape):
        up, down = x.copy(), x.copy()
        up[index] += h
        down[index] -= h
        grad[index] = (f(up) - f(down)) / (2 * h)
    return grad


CORRECTIONS = [None, TokenTIS(cap=1.2), IcePop(low=0.7, high=1.4), TokenMask(low=0.7, high=1.4),
               GeometricSequenceMask(low=0.9, high=1.1), SequenceTIS(cap=1.5), OffPolicySequenceMask(delta=0.05)]


@pytest.mark.parametrize("name", ["grpo", "gspo", "decoupled_ppo"])
@pytest.mark.parametrize("correction", CORRECTIONS, ids=lambda c: "none" if c is None else c.kind)
def test_losses_with_corrections_match_numpy_in_value_and_gradient(name, correction):
    """loss = Σ k·w·ℓ / N_tok, ℓ from the paper, (w, k) from the correction, and its gradient by central
    differences of the numpy formula, in float64."""
    if name == "decoupled_ppo" and correction is not None:
        return  # refused by the config (its own correction), see test_loss_config_rejects_bad_values
    config = LossConfig(algorithm=name, epsilon_low=EPS[0], epsilon_high=EPS[1], correction=correction,
                        loss_kwargs={"cap": 1.6} if name == "decoupled_ppo" else {})
    lp, old, behaviour, _, mask, adv = _case(seed=1)
    proximal = np_proximal(correction, old, behaviour)
    weights, keep = np_correction(correction, old, behaviour, adv, mask, current=lp)
    kwargs = {"cap": 1.6} if name == "decoupled_ppo" else {}

    def np_loss(x):  # (w, k) are stop-gradient: from lp, not x
        return _np_aggregate(keep * weights * np_policy_loss(name, x, old, behaviour, adv, mask, proximal, **kwargs),
                             mask, "token-mean")

    with jax.enable_x64(True):
        loss, metrics = ours(config, lp, old, behaviour, adv, mask)
        grad = jax.grad(lambda x: ours(config, x, old, behaviour, adv, mask)[0])(jnp.asarray(lp))
    np.testing.assert_allclose(loss, np_loss(lp), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(grad, finite_difference(np_loss, lp), atol=1e-7)
    assert np.abs(np.asarray(grad)).max() > 1e-3
    if correction is not None:  # the case exercises the correction: something is capped or masked
        assert (weights < np.exp(old - behaviour) - 1e-12).any() or (keep[mask > 0] == 0).any()
    np.testing.assert_allclose(metrics["is_weight_mean"], (weights * keep * mask).sum() / mask.sum(), rtol=1e-10)


def _stale_case(seed, first_update):
    """A packed case with stale tokens: a fifth of μ's logprobs are 3 to 8 nats off either way, so
    |log ρ| reaches 8. On a batch's first update π_old = π_θ; on a later one π_θ has moved from π_old by a
    per-sequence shift (the sequences whose drift from μ differs between the two) and token noise."""
    lp, _, _, _, mask, adv = _case(seed)
    rng = np.random.default_rng(seed + 100)
    seq = lambda scale: np.take_along_axis(rng.normal(0, scale, (3, 4)), SEGMENTS, axis=1)  # noqa: E731
    old = lp.copy() if first_update else lp + seq(0.3) + rng.normal(0, 0.1, lp.shape)
    stale = (rng.random(lp.shape) < 0.2) * rng.choice([-1.0, 1.0], lp.shape) * rng.uniform(3, 8, lp.shape)
    stale[1, 3], stale[2, 8] = 8.0, -8.0  # the extremes, whatever the draw
    behaviour = old + seq(0.2) + rng.normal(0, 0.3, lp.shape) + stale
    return lp, old, behaviour, mask, adv


PAPERS = [None, TokenTIS(cap=2.0), IcePop(), TokenMask(), OffPolicySequenceMask(delta=0.05)]


@pytest.mark.parametrize("first_update", [True, False], ids=["first", "later"])
@pytest.mark.parametrize("name", ["grpo", "gspo"])
@pytest.mark.parametrize("correction", PAPERS, ids=lambda c: "none" if c is None else c.kind)
def test_the_papers_corrections_with_stale_tokens_match_numpy(correction, name, first_update):
    """IcePop at the paper's band, the token mask, DeepSeek-V3.2's mask (drift from μ to π_θ) and the clip
    rule, against the papers' objectives in float64 on packed rows, values and gradients, on a batch's
    first update (π_old = sg[π_θ]) and a later one."""
    lp, old, behaviour, mask, adv = _stale_case(seed=21, first_update=first_update)
    config = LossConfig(algorithm=name, epsilon_low=EPS[0], epsilon_high=EPS[1], correction=correction)
    weights, keep = np_correction(correction, old, behaviour, adv, mask, current=lp)
    proximal = np_proximal(correction, old, behaviour)

    def np_loss(x):
        return _np_aggregate(keep * weights * np_policy_loss(name, x, old, behaviour, adv, mask, proximal),
                             mask, "token-mean")

    def f(x):
        return ours(config, x, old, behaviour, adv, mask, given_old=not first_update)

    with jax.enable_x64(True):
        loss, metrics = f(lp)
        grad = jax.grad(lambda x: f(x)[0])(jnp.asarray(lp))
    np.testing.assert_allclose(loss, np_loss(lp), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(grad, finite_difference(np_loss, lp), rtol=1e-6, atol=1e-7)
    assert np.abs(np.asarray(grad)).max() > 1e-3
    np.testing.assert_allclose(metrics["is_weight_mean"], (weights * keep * mask).sum() / mask.sum(), rtol=1e-10)
    rho = np.exp(old - behaviour)[mask > 0]
    assert np.abs(np.log(rho)).max() > 7.5  # the case is stale
    if correction is not None and correction.kind == "icepop":  # tokens both sides of the band and inside
        assert (rho < 0.5).any() and (rho > 5).any() and (np.abs(np.log(rho[(rho >= 0.5) & (rho <= 5)])) > 0.3).any()
    if correction is not None and correction.kind == "offpolicy_seq_mask":
        assert (keep[mask > 0] == 0).any()
        if not first_update:  # measured against π_old instead, the mask would differ
            _, keep_old = np_correction(correction, old, behaviour, adv, mask, current=old)
            assert (keep_old != keep)[mask > 0].any()


def test_the_clip_is_against_mu_under_a_mask_and_against_pi_old_under_a_weight():
    """The issue's token: positive advantage, ρ = π_old/μ = e^8 on a batch's first update. A mask that keeps
    it (DeepSeek-V3.2's: A > 0), like no correction, clips π_θ/μ = e^8: no gradient. Token TIS reweights
    by min(ρ, 2) and clips π_θ/π_old = 1: gradient −2·A/N. IcePop drops it (ρ > β = 5)."""
    segments = np.array([[1, 1, 1]], np.int32)
    mask = np.array([[0.0, 1.0, 1.0]])
    lp = np.array([[-1.0, -1.2, -0.7]])
    behaviour = lp - np.array([[0.0, 8.0, 0.0]])
    adv = np.ones_like(lp)
    expected = {None: [0.0, -0.5], OffPolicySequenceMask(delta=0.05): [0.0, -0.5], TokenTIS(cap=2.0): [-1.0, -0.5],
                IcePop(): [0.0, -0.5]}
    for correction, want in expected.items():
        config = LossConfig(correction=correction)
        with jax.enable_x64(True):
            grad = jax.grad(lambda x, c=config: ours(c, x, lp, behaviour, adv, mask, given_old=False,
                                                     segments=segments)[0])(jnp.asarray(lp))
        np.testing.assert_allclose(np.asarray(grad)[0, 1:], want, atol=1e-12, err_msg=str(correction))


def test_cispo_keeps_every_tokens_gradient_with_a_clipped_stop_gradient_weight():
    """CISPO: ℓ_t = −sg[clip(r_t)] A_t log π_θ(y_t), so ∂L/∂logp_t = −clip(r_t) A_t / N_tok, never 0 where
    r_t left the clip range (the tokens PPO would drop)."""
    lp, old, behaviour, _, mask, adv = _case(seed=2)
    config = LossConfig(algorithm="cispo", epsilon_low=EPS[0], epsilon_high=EPS[1])
    r = np.exp(lp - behaviour)
    expected = _np_aggregate(np_policy_loss("cispo", lp, old, behaviour, adv, mask, behaviour), mask, "token-mean")
    with jax.enable_x64(True):
        loss, metrics = ours(config, lp, old, behaviour, adv, mask)
        grad = jax.grad(lambda x: ours(config, x, old, behaviour, adv, mask)[0])(jnp.asarray(lp))
    np.testing.assert_allclose(loss, expected, rtol=1e-10)
    np.testing.assert_allclose(grad, -np.clip(r, 1 - EPS[0], 1 + EPS[1]) * adv * mask / mask.sum(), atol=1e-12)
    outside = ((r < 1 - EPS[0]) | (r > 1 + EPS[1])) & (mask > 0) & (adv != 0)
    assert outside.any() and (np.asarray(grad)[outside] != 0).all()
    np.testing.assert_allclose(metrics["ratio_mean"], (r * mask).sum() / mask.sum(), rtol=1e-10)
    # the weight is clipped whatever A's sign, and the clip fractions count it so
    low, high = (r < 1 - EPS[0]) * mask, (r > 1 + EPS[1]) * mask
    np.testing.assert_allclose(metrics["clip_frac_low"], low.sum() / mask.sum(), rtol=1e-10)
    np.testing.assert_allclose(metrics["clip_frac_high"], high.sum() / mask.sum(), rtol=1e-10)
    assert (low * (adv > 0)).sum() > 0 and (high * (adv < 0)).sum() > 0  # tokens a sign-gated count would miss


def test_gspo_token_has_gspos_value_and_a_per_token_gradient():
    """GSPO-token: s_it = sg[s_i] π_θ(y_t)/sg[π_θ(y_t)]: GSPO's value; ∂/∂logp_it = −A_it s_i / N_tok where
    unclipped (with per-sequence advantages it equals GSPO's gradient: the paper's remark)."""
    lp, old, behaviour, _, mask, adv = _case(seed=3)
    wide = dict(epsilon_low=0.9, epsilon_high=10.0)  # nothing clipped
    with jax.enable_x64(True):
        values = {name: ours(LossConfig(algorithm=name, **wide), lp, old, behaviour, adv, mask)[0]
                  for name in ("gspo", "gspo-token")}
        grads = {name: jax.grad(lambda x, n=name: ours(LossConfig(algorithm=n, **wide), x, old, behaviour, adv,
                                                        mask)[0])(jnp.asarray(lp)) for name in ("gspo", "gspo-token")}
    np.testing.assert_allclose(values["gspo-token"], values["gspo"], rtol=1e-12)
    s = np.exp(_seq_mean(lp - behaviour, mask))
    np.testing.assert_allclose(grads["gspo-token"], -adv * s * mask / mask.sum(), atol=1e-12)
    np.testing.assert_allclose(grads["gspo"], grads["gspo-token"], atol=1e-12)


def test_gspo_sequence_ratio_is_per_packed_sequence_not_per_row():
    """Two sequences in one row have two ratios: the same tokens laid out one per row give the same loss."""
    lp, old, behaviour, _, mask, adv = _case(seed=4)
    config = LossConfig(algorithm="gspo", aggregation="seq-mean-token-mean")
    unpacked = [(r, cols) for r, cols in _sequences_np(SEGMENTS)]
    width = max(len(cols) for _, cols in unpacked)

    def spread(x):
        out = np.zeros((len(unpacked), width))
        for i, (r, cols) in enumerate(unpacked):
            out[i, :len(cols)] = x[r, cols]
        return out

    segments = (spread(np.ones_like(lp)) > 0).astype(np.int32)
    with jax.enable_x64(True):
        packed = ours(config, lp, old, behaviour, adv, mask)[0]
        one_per_row_loss = ours(config, *(spread(x) for x in (lp, old, behaviour, adv, mask)), segments=segments)[0]
    np.testing.assert_allclose(packed, one_per_row_loss, rtol=1e-12)


def test_k3_matches_formula_and_is_nonnegative():
    logps, _, _, ref, _, _ = _case()
    r = ref - logps
    np.testing.assert_allclose(k3_kl(jnp.asarray(logps), jnp.asarray(ref)), np.exp(r) - r - 1, atol=1e-6)
    assert float(k3_kl(jnp.asarray(logps), jnp.asarray(ref)).min()) >= 0.0
    np.testing.assert_allclose(k3_kl(jnp.asarray(logps), jnp.asarray(logps)), 0.0)


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
def test_grpo_aggregations_and_metrics_match_numpy(aggregation):
    lp, old, behaviour, ref, mask, adv = _case(seed=11)  # a case that clips on both sides
    beta, const = 0.05, 16.0
    r = np.exp(lp - behaviour)
    pg = _clip_loss(r, adv, *EPS)
    kl = np.exp(ref - lp) - (ref - lp) - 1
    config = LossConfig(epsilon_low=EPS[0], epsilon_high=EPS[1], beta=beta, aggregation=aggregation,
                        constant_normalizer=const)
    with jax.enable_x64(True):
        loss, metrics = ours(config, lp, old, behaviour, adv, mask, ref)
    np.testing.assert_allclose(loss, _np_aggregate(pg + beta * kl, mask, aggregation, const), rtol=1e-10)
    np.testing.assert_allclose(metrics["policy_loss"], _np_aggregate(pg, mask, aggregation, const), rtol=1e-10)
    np.testing.assert_allclose(metrics["kl"], (kl * mask).sum() / mask.sum(), rtol=1e-10)
    low = ((r < 1 - EPS[0]) & (adv < 0)) * mask
    high = ((r > 1 + EPS[1]) & (adv > 0)) * mask
    np.testing.assert_allclose(metrics["clip_frac_low"], low.sum() / mask.sum(), atol=1e-12)
    np.testing.assert_allclose(metrics["clip_frac_high"], high.sum() / mask.sum(), atol=1e-12)
    assert low.sum() > 0 and high.sum() > 0
    np.testing.assert_allclose(metrics["behaviour_gap"], (np.abs(lp - behaviour) * mask).sum() / mask.sum())


def test_correction_metrics_match_numpy():
    """ρ = π_old/μ over the loss tokens: its mean and second moment (ESS), the k3-form KL(π_old ‖ μ) from μ's
    samples, the capped and masked token fractions and the sequences masked whole."""
    lp, old, behaviour, _, mask, adv = _case(seed=6)
    rho = np.exp(old - behaviour)
    n = mask.sum()
    with jax.enable_x64(True):
        _, tis = ours(LossConfig(correction=TokenTIS(cap=1.2)), lp, old, behaviour, adv, mask)
        _, geo = ours(LossConfig(correction=GeometricSequenceMask(low=0.9, high=1.1)), lp, old, behaviour, adv, mask)
    np.testing.assert_allclose(tis["is_ratio_mean"], (rho * mask).sum() / n, rtol=1e-10)
    np.testing.assert_allclose(tis["is_ratio_sq_mean"], (rho**2 * mask).sum() / n, rtol=1e-10)
    np.testing.assert_allclose(tis["kl_old_behaviour"], ((rho * np.log(rho) - rho + 1) * mask).sum() / n, rtol=1e-10)
    np.testing.assert_allclose(tis["capped_token_frac"], ((rho > 1.2) * mask).sum() / n, rtol=1e-10)
    assert float(tis["masked_token_frac"]) == 0.0 and float(tis["masked_seq_frac"]) == 0.0
    _, keep = np_correction(GeometricSequenceMask(low=0.9, high=1.1), old, behaviour, adv, mask)
    seqs = [(r, cols) for r, cols in _sequences_np(SEGMENTS) if mask[r, cols].sum() > 0]
    masked = sum(keep[r, cols].max() == 0 for r, cols in seqs)
    assert 0 < masked < len(seqs)
    np.testing.assert_allclose(geo["masked_seq_frac"], masked / len(seqs), rtol=1e-10)
    np.testing.assert_allclose(geo["masked_token_frac"], ((1 - keep) * mask).sum() / n, rtol=1e-10)


def test_the_metrics_clamp_log_rho_and_say_how_often():
    """Beyond |log ρ| = 20 the KL estimate is the clamped one (documented: 99 % low at log ρ = 25), and
    log_ratio_clamped_frac counts the tokens that were clamped."""
    segments = np.array([[1, 1, 1]], np.int32)
    mask = np.array([[0.0, 1.0, 1.0]])
    lp = np.zeros((1, 3))
    behaviour = -np.array([[0.0, 25.0, 0.0]])
    with jax.enable_x64(True):
        _, metrics = ours(LossConfig(), lp, lp, behaviour, np.ones_like(lp), mask, segments=segments)
    k = lambda x: np.exp(x) * x - np.exp(x) + 1  # noqa: E731  (ρ log ρ − ρ + 1 at log ρ = x)
    np.testing.assert_allclose(metrics["kl_old_behaviour"], k(20.0) / 2, rtol=1e-10)
    assert float(metrics["kl_old_behaviour"]) < 0.01 * k(25.0) / 2
    assert float(metrics["log_ratio_clamped_frac"]) == pytest.approx(0.5)


def test_aggregate_rejects_unknown_mode_and_ignores_empty_sequences():
    per_token = jnp.ones((3, 4))
    mask = jnp.asarray([[1, 1, 0, 0], [0, 0, 0, 0], [1, 1, 1, 1]], jnp.float32)  # row 1 is padding
    seqs = one_per_row(mask)
    norm = normalizer_for(mask, seqs)
    assert float(norm.num_tokens) == 6 and float(norm.num_sequences) == 2
    assert float(aggregate(per_token, mask, norm, "seq-mean-token-mean", seqs)) == pytest.approx(1.0)
    assert float(aggregate(per_token, mask, norm, "seq-mean-token-sum", seqs)) == pytest.approx(3.0)
    with pytest.raises(ValueError, match="aggregation"):
        aggregate(per_token, mask, norm, "sum", seqs)


# ---------------------------------------------------------------------------------------------
# Micro-batch accumulation


LOSSES = ["grpo", "gspo", "gspo-token", "cispo"]


@pytest.mark.parametrize("algorithm, aggregation, correction", [
    *((name, aggregation, None) for name in LOSSES for aggregation in AGGREGATIONS),
    *((name, "seq-mean-token-mean", c) for name in LOSSES for c in (SequenceTIS(cap=1.5), IcePop(low=0.7, high=1.4))),
], ids=str)
def test_micro_batches_sum_to_full_batch(algorithm, aggregation, correction):
    """Σ over micro-batches (of rows) of (loss, grad, metrics) with global normalisers == full-batch values."""
    segments = np.tile(SEGMENTS, (3, 1))
    segments[4] = 0  # a padding row must not count as a sequence anywhere
    lp, old, behaviour, ref, mask, adv = _case(seed=7, segments=segments)
    config = LossConfig(algorithm=algorithm, beta=0.02, aggregation=aggregation, constant_normalizer=8.0,
                        epsilon_high=0.28, correction=correction)
    j = jnp.asarray
    seqs = Sequences.of(j(segments))
    norm = normalizer_for(j(mask, jnp.float32), seqs)

    def run(rows, normalizer):
        def f(x):
            part = Sequences.of(j(segments[rows]))
            return rl_loss(x, j(behaviour[rows], jnp.float32), j(adv[rows], jnp.float32), j(mask[rows], jnp.float32),
                           part, config, normalizer, resolve_policy_loss(config),
                           old_logps=j(old[rows], jnp.float32), ref_logps=j(ref[rows], jnp.float32))
        (loss, metrics), grad = jax.value_and_grad(f, has_aux=True)(j(lp[rows], jnp.float32))
        return loss, metrics, grad

    full_loss, full_metrics, full_grad = run(slice(None), norm)
    parts = [run(slice(i, i + 4), norm) for i in range(0, 9, 4)]  # uneven micro-batches: 4, 4, 1
    np.testing.assert_allclose(sum(p[0] for p in parts), full_loss, atol=1e-6)
    np.testing.assert_allclose(np.concatenate([p[2] for p in parts]), full_grad, atol=1e-6)
    for key, value in full_metrics.items():
        np.testing.assert_allclose(sum(p[1][key] for p in parts), value, atol=1e-5, err_msg=key)
    # A micro-batch normalised by itself would give a different answer (the test can fail).
    own = [run(slice(i, i + 4), normalizer_for(j(mask[i:i + 4], jnp.float32), Sequences.of(j(segments[i:i + 4]))))[0]
           for i in range(0, 9, 4)]
    assert abs(float(sum(own)) - float(full_loss)) > 1e-4


# ---------------------------------------------------------------------------------------------
# The learner's old policy


def test_without_old_logps_the_old_policy_is_the_current_one():
    """On a batch's first update π_old = sg[π_θ]: with token TIS the ratio is 1 and the weight is
    min(π_θ/μ, C), so the loss is −Σ w A / N and its gradient −w A / N (the weight is stop-gradient)."""
    lp, old, behaviour, _, mask, adv = _case(seed=8)
    config = LossConfig(correction=TokenTIS(cap=1.5))
    w = np.minimum(np.exp(lp - behaviour), 1.5)
    with jax.enable_x64(True):
        loss, metrics = ours(config, lp, old, behaviour, adv, mask, given_old=False)
        grad = jax.grad(lambda x: ours(config, x, old, behaviour, adv, mask, given_old=False)[0])(jnp.asarray(lp))
    np.testing.assert_allclose(loss, (-adv * w * mask).sum() / mask.sum(), rtol=1e-10)
    np.testing.assert_allclose(grad, -adv * w * mask / mask.sum(), atol=1e-12)
    assert float(metrics["ratio_mean"]) == pytest.approx(1.0)


# ---------------------------------------------------------------------------------------------
# Configuration, plug-ins and argument errors


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"algorithm": "ppo"}, "unknown policy loss"),
        ({"aggregation": "sum"}, "aggregation"),
        ({"aggregation": "constant"}, "constant_normalizer"),
        ({"dynamic_sampling": "yes"}, "dynamic_sampling"),
        ({"estimator": "ppo"}, "estimator"),
        ({"epsilon_low": 1.0}, "epsilon"),
        ({"beta": -0.1}, "beta"),
        ({"algorithm": "decoupled_ppo", "correction": TokenTIS()}, "carries its own correction"),
        ({"correction": IcePop(low=2.0, high=1.0)}, "low < high"),
        ({"correction": TokenMask(low=2.0, high=1.0)}, "low < high"),
        ({"advantage": "reward_to_go", "estimator": "rloo"}, "leave-one-out"),
        ({"advantage": "reward_to_go", "algorithm": "gspo"}, "sequence ratio"),
    ],
)
def test_loss_config_rejects_bad_values(kwargs, match):
    """Its own fields when built; the registered names and what they declare when checked (config load, Trainer)."""
    with pytest.raises(ValueError, match=match):
        check_registered(LossConfig(**kwargs))


def _sequence_loss(t, config):
    return -t.advantages * t.sequences.mean(t.logps, t.mask), {}


def _own_baseline(s, epsilon):
    return s.centred, np.ones_like(s.mean)


def test_registered_names_are_the_configs_choices():
    """A loss or estimator registered by name is accepted by the config (the registry is the list of names),
    and what it declares is what the config checks: a sequence ratio, a baseline of each completion's own."""
    policy_loss("test_sequence_loss", sequence_ratio=True)(_sequence_loss)
    estimator("test_own_baseline", divides_by_std=False, group_baseline=False)(_own_baseline)
    check_registered(LossConfig(algorithm="test_sequence_loss", estimator="test_own_baseline"))
    with pytest.raises(ValueError, match="sequence ratio"):
        check_registered(LossConfig(algorithm="test_sequence_loss", advantage="reward_to_go"))
    with pytest.raises(ValueError, match="baseline is each completion's own"):
        check_registered(LossConfig(estimator="test_own_baseline", advantage="reward_to_go"))
    check_registered(LossConfig(algorithm="test_learner_losses:user_loss", advantage="reward_to_go"))  # per token
    with pytest.raises(ValueError, match="unknown policy loss 'not_registered'"):
        check_registered(LossConfig(algorithm="not_registered"))


def user_loss(t, config, scale: float = 1.0):
    """A user's loss (referenced as 'test_learner_losses:user_loss'): REINFORCE on the advantage."""
    return -scale * t.advantages * t.logps, {"scaled": jnp.full_like(t.logps, scale)}


def test_a_users_loss_is_resolved_by_reference_with_its_kwargs():
    lp, old, behaviour, _, mask, adv = _case(seed=9)
    config = LossConfig(algorithm="test_learner_losses:user_loss", loss_kwargs={"scale": 2.0})
    with jax.enable_x64(True):
        loss, metrics = ours(config, lp, old, behaviour, adv, mask)
    np.testing.assert_allclose(loss, (-2.0 * adv * lp * mask).sum() / mask.sum(), rtol=1e-10)
    assert float(metrics["scaled"]) == pytest.approx(2.0)
    with pytest.raises(ValueError, match="does not take algo.loss_kwargs"):
        resolve_policy_loss(LossConfig(algorithm="test_learner_losses:user_loss", loss_kwargs={"temperature": 1}))
    with pytest.raises(ValueError, match="has no attribute"):
        resolve_policy_loss(LossConfig(algorithm="test_learner_losses:nothing_here"))


def test_rl_loss_argument_errors():
    lp, old, behaviour, _, mask, adv = _case()
    j = jnp.asarray
    seqs = Sequences.of(j(SEGMENTS))
    norm = Normalizer(j(mask.sum()), j(5.0))
    config = LossConfig(beta=0.1)
    with pytest.raises(ValueError, match="ref_logps"):
        rl_loss(j(lp), j(behaviour), j(adv), j(mask), seqs, config, norm, resolve_policy_loss(config))
    with pytest.raises(ValueError, match="advantages"):
        rl_loss(j(lp), j(behaviour), j(adv[:, :-1]), j(mask), seqs, LossConfig(), norm,
                resolve_policy_loss(LossConfig()))
    assert dataclasses.is_dataclass(LossConfig) and LossConfig().beta == 0.0


def test_the_loss_takes_each_tokens_own_behaviour_logprob_across_a_version_boundary():
    """A completion continued across a weight load (rollout.weight_update=keep): its first three tokens were
    sampled by version 2, the rest by version 3, each with the behaviour logprob μ_t of the version that drew
    it. The packed batch carries μ_t token for token, and the loss (token TIS, the decoupled ratio) equals the
    paper's objective with each token's own μ_t, not one version's for the whole completion."""
    from learner.algo.rl_batch import assemble_rl_batch
    from learner.service.group_validation import CompletionRecord, GroupRecord

    mu = [-0.5, -1.0, -1.5, -2.6, -0.2, -3.0]
    completion = CompletionRecord(token_ids=[7, 8, 9, 10, 11, 12], logprobs=mu, finish_reason="stop", reward=1.0,
                                  unscorable_reason=None, versions=[2, 2, 2, 3, 3, 3])
    group = GroupRecord("g", "a", 2, [1, 2, 3], [completion], {})
    advantages = np.full(6, 1.5)  # one per completion token
    batch, _ = assemble_rl_batch([group], [[advantages]], np.ones((1, 1)), pad_id=0, row_tokens=10)
    tokens = np.flatnonzero(batch.completion_mask[0])
    np.testing.assert_array_equal(tokens, np.arange(3, 9))
    np.testing.assert_array_equal(batch.behaviour_logps[0, tokens], np.float32(mu))

    rng = np.random.default_rng(3)
    old = np.zeros((1, 10))
    old[0, tokens] = np.array(mu) + rng.normal(0, 0.4, 6)  # the learner's π_old: near each token's own μ
    lp = old + rng.normal(0, 0.1, old.shape)
    behaviour, adv, mask = (np.asarray(a, np.float64) for a in (batch.behaviour_logps, batch.advantages,
                                                                batch.completion_mask))
    segments = batch.segment_ids.astype(np.int32)
    config = LossConfig(algorithm="grpo", epsilon_low=EPS[0], epsilon_high=EPS[1], correction=TokenTIS(cap=2.0))

    def np_loss(mu_per_token):
        weights = np.minimum(np.exp(old - mu_per_token), 2.0)
        per_token = weights * _clip_loss(np.exp(lp - old), adv, *EPS)
        return (per_token * mask).sum() / mask.sum()

    with jax.enable_x64(True):
        loss, _ = ours(config, lp, old, behaviour, adv, mask, segments=segments)
    np.testing.assert_allclose(loss, np_loss(behaviour), rtol=1e-6)
    one_version = behaviour.copy()
    one_version[0, tokens] = mu[0]  # as if version 2's first μ stood for the whole completion
    assert abs(np_loss(one_version) - np_loss(behaviour)) > 0.1

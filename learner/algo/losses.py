"""Policy-gradient losses for GRPO, GSPO and GSPO-token, with the Dr.GRPO / DAPO knobs.

Every function here is a pure `jnp` function of per-token log-probabilities, masks and advantages,
so the train step can jit and differentiate it. Shapes: `B` completions, `T` completion tokens.

Notation (all per token t of completion i, masked by m_it ∈ {0, 1}):
    logp_it   log π_θ(y_it | ·)             current policy (carries the gradient)
    old_it    log π_old(y_it | ·)            behaviour policy: what the actors sampled with
    ref_it    log π_ref(y_it | ·)            frozen reference (only needed when β > 0)
    A_it      advantage of the turn that sampled token t (learner.algo.advantages, .turn_advantages);
              a single-turn completion's A_i on every token

Micro-batching: every loss is a *sum* over its tokens divided by normalisers of the **global**
batch (`Normalizer`, computed once from the whole batch's mask by `normalizer_for`). Hence the sum
of the micro-batch losses (and of their gradients and metrics) equals the full-batch value.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from learner.schema import (  # noqa: F401  (the loss config lives in the light schema module)
    AGGREGATIONS,
    ALGORITHMS,
    DYNAMIC_SAMPLING,
    Aggregation,
    Algorithm,
    DynamicSampling,
    LossConfig,
)


class Normalizer(NamedTuple):
    """Denominators of the whole (global) batch, shared by all its micro-batches."""

    num_tokens: jax.Array  # Σ_it m_it
    num_sequences: jax.Array  # number of completions with at least one loss token


def normalizer_for(mask: jax.Array) -> Normalizer:
    """Normaliser of a batch from its [B, T] loss mask; call it on the global batch, not a micro-batch."""
    mask = jnp.asarray(mask, jnp.float32)
    return Normalizer(num_tokens=mask.sum(), num_sequences=(mask.sum(-1) > 0).sum().astype(jnp.float32))


def k3_kl(logps: jax.Array, ref_logps: jax.Array) -> jax.Array:
    """Per-token k3 estimator of KL(π_θ ‖ π_ref) (Schulman): exp(r) − r − 1 with r = ref − logp.

    Unbiased for samples from π_θ and never negative.
    """
    r = ref_logps - logps
    return jnp.exp(r) - r - 1.0


def tis_weights(learner_old_logps: jax.Array, behaviour_logps: jax.Array, cap: float) -> jax.Array:
    """Truncated importance weights w_t = sg[min(exp(old_learner_t − behaviour_t), C)].

    They correct for the gap between what the actors sampled with (vLLM numerics, stale weights) and
    the learner's own evaluation of the same policy (Yao et al., 2025, "off-policy RL in disguise").
    """
    return jax.lax.stop_gradient(jnp.minimum(jnp.exp(learner_old_logps - behaviour_logps), cap))


def masked_sequence_mean(x: jax.Array, mask: jax.Array) -> jax.Array:
    """Per-sequence mean over the mask, [B, T] -> [B]; 0 for an empty sequence."""
    return (x * mask).sum(-1) / jnp.maximum(mask.sum(-1), 1.0)


def log_ratio(algorithm: str, logps: jax.Array, old_logps: jax.Array, mask: jax.Array) -> jax.Array:
    """Log importance ratio per token, [B, T], for each algorithm.

    grpo:        log r_it = logp_it − old_it                                   (token-level)
    gspo:        log s_i  = mean_t (logp_it − old_it), broadcast over t         (sequence-level)
    gspo-token:  log s_it = sg[log s_i] + logp_it − sg[logp_it]
                 (value of s_i, gradient of a per-token ratio: s_it = sg[s_i] · π_θ(y_t) / sg[π_θ(y_t)])
    """
    token = logps - old_logps
    if algorithm == "grpo":
        return token
    seq = masked_sequence_mean(token, mask)[:, None]
    if algorithm == "gspo":
        return jnp.broadcast_to(seq, token.shape)
    if algorithm == "gspo-token":
        return jax.lax.stop_gradient(seq) + logps - jax.lax.stop_gradient(logps)
    raise ValueError(f"algorithm must be one of {ALGORITHMS}, got {algorithm!r}")


def clipped_surrogate(
    log_r: jax.Array, advantages: jax.Array, epsilon_low: float, epsilon_high: float
) -> jax.Array:
    """PPO clipped surrogate as a loss: −min(r · A, clip(r, 1 − ε_low, 1 + ε_high) · A), per token
    (advantages [B, T])."""
    ratio = jnp.exp(log_r)
    return -jnp.minimum(ratio * advantages, jnp.clip(ratio, 1.0 - epsilon_low, 1.0 + epsilon_high) * advantages)


def aggregate(
    per_token: jax.Array,
    mask: jax.Array,
    norm: Normalizer,
    aggregation: str,
    constant_normalizer: float | None = None,
) -> jax.Array:
    """Reduce a [B, T] per-token loss to a scalar with global-batch denominators (N_tok, N_seq):

    token-mean:           Σ_i Σ_t m ℓ / N_tok
    seq-mean-token-mean:  Σ_i (Σ_t m ℓ / |o_i|) / N_seq
    seq-mean-token-sum:   Σ_i Σ_t m ℓ / N_seq
    constant (Dr.GRPO):   Σ_i Σ_t m ℓ / (N_seq · L)
    """
    summed = per_token * mask
    if aggregation == "token-mean":
        return summed.sum() / jnp.maximum(norm.num_tokens, 1.0)
    if aggregation == "seq-mean-token-mean":
        return masked_sequence_mean(per_token, mask).sum() / jnp.maximum(norm.num_sequences, 1.0)
    if aggregation == "seq-mean-token-sum":
        return summed.sum() / jnp.maximum(norm.num_sequences, 1.0)
    if aggregation == "constant":
        if not constant_normalizer:
            raise ValueError("aggregation='constant' needs a positive constant_normalizer")
        return summed.sum() / (jnp.maximum(norm.num_sequences, 1.0) * constant_normalizer)
    raise ValueError(f"aggregation must be one of {AGGREGATIONS}, got {aggregation!r}")


def policy_loss(
    logps: jax.Array,
    behaviour_logps: jax.Array,
    advantages: jax.Array,
    mask: jax.Array,
    config: LossConfig,
    norm: Normalizer,
    *,
    ref_logps: jax.Array | None = None,
    learner_old_logps: jax.Array | None = None,
    entropy: jax.Array | None = None,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """RL loss of one (micro-)batch and its metrics.

        ℓ_it = w_it · −min(ρ_it A_it, clip(ρ_it, 1 − ε_low, 1 + ε_high) A_it) + β · k3(logp_it, ref_it)
        loss = aggregate(ℓ, m)        (see `aggregate`; ρ from `log_ratio`)

    Without TIS (tis_cap None): ρ = π_θ / π_behaviour and w = 1.
    With TIS: ρ = π_θ / π_old_learner and w = min(π_old_learner / π_behaviour, C) (stop-grad), where
    π_old_learner is the learner's own evaluation of the pre-update policy (`learner_old_logps`;
    default sg[logp], exact when the batch gets one optimizer step). As in verl, w multiplies the
    policy term, not the KL term.

    Args: logps, behaviour_logps, mask (and ref_logps, learner_old_logps, entropy): [B, T];
      advantages: [B] (one per sequence) or [B, T] (per token: multi-turn credit; GSPO's sequence ratio
      needs one advantage per sequence, so its config refuses a per-turn rule); norm:
      `normalizer_for(global_batch_mask)`.
    Returns: (loss, metrics); metrics are global-batch normalised too, so they sum over micro-batches:
      policy_loss, kl, clip_frac_low, clip_frac_high, ratio_mean, tis_weight_mean, entropy, and
      behaviour_gap = token-mean |logp − behaviour|: before the update, the training–inference
      mismatch (learner vs vLLM numerics, bf16) plus staleness, what `tis_cap` corrects.
    """
    mask = jnp.asarray(mask, logps.dtype)
    advantages = jnp.asarray(advantages, logps.dtype)
    if advantages.shape == logps.shape[:1]:
        advantages = jnp.broadcast_to(advantages[:, None], logps.shape)
    if advantages.shape != logps.shape:
        raise ValueError(f"advantages must be [B]={logps.shape[:1]} or [B, T]={logps.shape}, got {advantages.shape}")
    if config.tis_cap is None:
        old_logps, weights = behaviour_logps, jnp.ones_like(logps)
    else:
        old_logps = jax.lax.stop_gradient(logps) if learner_old_logps is None else learner_old_logps
        weights = tis_weights(old_logps, behaviour_logps, config.tis_cap)

    log_r = log_ratio(config.algorithm, logps, old_logps, mask)
    pg = weights * clipped_surrogate(log_r, advantages, config.epsilon_low, config.epsilon_high)

    def agg(x: jax.Array) -> jax.Array:
        return aggregate(x, mask, norm, config.aggregation, config.constant_normalizer)

    def token_mean(x: jax.Array) -> jax.Array:
        return aggregate(jax.lax.stop_gradient(x), mask, norm, "token-mean")

    zero = jnp.zeros((), logps.dtype)
    if config.beta > 0.0:
        if ref_logps is None:
            raise ValueError("beta > 0 needs ref_logps (the frozen reference policy's logprobs)")
        kl = k3_kl(logps, ref_logps)
        loss, kl_metric = agg(pg + config.beta * kl), token_mean(kl)
    else:
        loss, kl_metric = agg(pg), zero

    ratio = jnp.exp(jax.lax.stop_gradient(log_r))
    adv = advantages  # [B, T]
    metrics = {
        "policy_loss": jax.lax.stop_gradient(agg(pg)),
        "kl": kl_metric,
        "clip_frac_low": token_mean(((ratio < 1.0 - config.epsilon_low) & (adv < 0)).astype(logps.dtype)),
        "clip_frac_high": token_mean(((ratio > 1.0 + config.epsilon_high) & (adv > 0)).astype(logps.dtype)),
        "ratio_mean": token_mean(ratio),
        "tis_weight_mean": token_mean(weights),
        "behaviour_gap": token_mean(jnp.abs(logps - behaviour_logps)),
        "entropy": zero if entropy is None else token_mean(entropy),
    }
    return loss, metrics

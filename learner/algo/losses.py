"""The RL loss of one (micro-)batch: an off-policy correction, a policy loss, an aggregation, a KL term.

    (w, k)  = correction(π_θ, π_old, μ, A)                           learner.algo.corrections
    π_prox  = π_old if the correction reweights by π_old/μ, else μ    (corrections.proximal_logps)
    ℓ_it    = policy_loss(π_θ, π_old, μ, π_prox, A)                  learner.algo.policy_losses
    loss    = aggregate(k · w · ℓ + β · k3(π_θ, π_ref), m)           the Dr.GRPO / DAPO knobs (`aggregate`)
              − α · aggregate(H, m)                                   the entropy bonus (learner.algo.entropy)

Every function here is a pure `jnp` function of per-token log-probabilities, masks and advantages, so the
train step can jit and differentiate it. Shapes: `B` rows, `T` tokens; a packed row holds several
sequences (learner.algo.sequences), and "per sequence" always means per packed sequence, never per row.

    logp_it   log π_θ(y_it | ·)      current policy (carries the gradient)
    old_it    log π_old(y_it | ·)    the learner's own evaluation of the pre-update policy: sg[logp] on a
                                     batch's first update, the first update's logprobs on the later ones
                                     (train.num_iterations > 1)
    beh_it    log μ(y_it | ·)        behaviour policy: what the actors sampled with
    ref_it    log π_ref(y_it | ·)    frozen reference (only needed when β > 0)
    A_it      advantage of the turn that sampled token t (learner.algo.advantages, .turn_advantages)

Micro-batching: every loss is a *sum* over its tokens divided by normalisers of the **global** batch
(`Normalizer`, computed once from the whole batch's mask by `normalizer_for`). Hence the sum of the
micro-batch losses (and of their gradients and metrics) equals the full-batch value.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp

from learner.algo.corrections import correct, proximal_logps
from learner.algo.policy_losses import LossOutput, PolicyTerms
from learner.algo.sequences import Sequences
from learner.schema import (  # noqa: F401  (the loss config lives in the light schema module)
    AGGREGATIONS,
    DYNAMIC_SAMPLING,
    Aggregation,
    DynamicSampling,
    LossConfig,
)

LOG_RATIO_BOUND = 20.0  # |log ρ| beyond this is clamped in the metrics (the token sums of ρ² overflow float32)


class Normalizer(NamedTuple):
    """Denominators of the whole (global) batch, shared by all its micro-batches."""

    num_tokens: jax.Array  # Σ_it m_it
    num_sequences: jax.Array  # number of sequences with at least one loss token


def normalizer_for(mask: jax.Array, sequences: Sequences | None = None) -> Normalizer:
    """Normaliser of a batch from its [B, T] loss mask and its sequences (None: a sequence per row); call it
    on the global batch, not a micro-batch."""
    mask = jnp.asarray(mask, jnp.float32)
    sequences = sequences or Sequences.of(jnp.ones(mask.shape, jnp.int32))
    return Normalizer(num_tokens=mask.sum(),
                      num_sequences=(sequences.per_sequence(mask) > 0).sum().astype(jnp.float32))


def k3_kl(logps: jax.Array, ref_logps: jax.Array) -> jax.Array:
    """Per-token k3 estimator of KL(π_θ ‖ π_ref) (Schulman): exp(r) − r − 1 with r = ref − logp.

    Unbiased for samples from π_θ and never negative.
    """
    r = ref_logps - logps
    return jnp.exp(r) - r - 1.0


def aggregate(
    per_token: jax.Array,
    mask: jax.Array,
    norm: Normalizer,
    aggregation: str,
    sequences: Sequences,
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
        lengths = jnp.maximum(sequences.total(mask), 1.0)  # |o_i| at each of its tokens
        return (summed / lengths).sum() / jnp.maximum(norm.num_sequences, 1.0)
    if aggregation == "seq-mean-token-sum":
        return summed.sum() / jnp.maximum(norm.num_sequences, 1.0)
    if aggregation == "constant":
        if not constant_normalizer:
            raise ValueError("aggregation='constant' needs a positive constant_normalizer")
        return summed.sum() / (jnp.maximum(norm.num_sequences, 1.0) * constant_normalizer)
    raise ValueError(f"aggregation must be one of {AGGREGATIONS}, got {aggregation!r}")


def rl_loss(
    logps: jax.Array,
    behaviour_logps: jax.Array,
    advantages: jax.Array,
    mask: jax.Array,
    sequences: Sequences,
    config: LossConfig,
    norm: Normalizer,
    loss_fn: Callable[[PolicyTerms], LossOutput],
    *,
    old_logps: jax.Array | None = None,
    ref_logps: jax.Array | None = None,
    entropy: jax.Array | None = None,
    entropy_coef: jax.Array | float = 0.0,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """RL loss of one (micro-)batch and its metrics (the module docstring's composition).

    Args: logps, behaviour_logps, mask (and old_logps, ref_logps, entropy): [B, T]; advantages: [B] (one
      per row) or [B, T] (per token); sequences: the rows' packed sequences; loss_fn: the policy loss
      (`policy_losses.resolve_policy_loss`); old_logps: the learner's pre-update logprobs, None on a
      batch's first update (then sg[logps], the same values); norm: `normalizer_for(global batch mask)`;
      entropy_coef: α of the entropy bonus (a traced scalar, or 0.0: no bonus; `entropy` must carry the
      gradient then).
    Returns: (loss, metrics); metrics are global-batch normalised too, so they sum over micro-batches:
      policy_loss, kl, entropy, behaviour_gap = token-mean |logp − behaviour| (before the update: the
      training–inference mismatch plus staleness), the loss's own (ratio_mean, clip fractions, ...) and the
      correction's (`correction_metrics`).
    """
    mask = jnp.asarray(mask, logps.dtype)
    advantages = jnp.asarray(advantages, logps.dtype)
    if advantages.shape == logps.shape[:1]:
        advantages = jnp.broadcast_to(advantages[:, None], logps.shape)
    if advantages.shape != logps.shape:
        raise ValueError(f"advantages must be [B]={logps.shape[:1]} or [B, T]={logps.shape}, got {advantages.shape}")
    old_logps = jax.lax.stop_gradient(logps if old_logps is None else old_logps)
    corrected = correct(config.correction, logps, old_logps, behaviour_logps, advantages, mask, sequences)
    proximal = proximal_logps(config.correction, old_logps, behaviour_logps)
    per_token, loss_metrics = loss_fn(PolicyTerms(logps, old_logps, behaviour_logps, proximal, advantages, mask,
                                                  sequences))
    pg = corrected.weights * corrected.keep * per_token

    def agg(x: jax.Array) -> jax.Array:
        return aggregate(x, mask, norm, config.aggregation, sequences, config.constant_normalizer)

    def token_mean(x: jax.Array) -> jax.Array:
        return aggregate(jax.lax.stop_gradient(x), mask, norm, "token-mean", sequences)

    zero = jnp.zeros((), logps.dtype)
    if config.beta > 0.0:
        if ref_logps is None:
            raise ValueError("beta > 0 needs ref_logps (the frozen reference policy's logprobs)")
        kl = k3_kl(logps, ref_logps)
        loss, kl_metric = agg(pg + config.beta * kl), token_mean(kl)
    else:
        loss, kl_metric = agg(pg), zero
    if not (isinstance(entropy_coef, float) and entropy_coef == 0.0):
        if entropy is None:
            raise ValueError("an entropy bonus needs the per-token entropy")
        loss = loss - entropy_coef * agg(entropy)

    metrics = {
        "policy_loss": jax.lax.stop_gradient(agg(pg)),
        "kl": kl_metric,
        **{name: token_mean(value) for name, value in loss_metrics.items()},
        "behaviour_gap": token_mean(jnp.abs(logps - behaviour_logps)),
        "entropy": zero if entropy is None else token_mean(entropy),
        **correction_metrics(old_logps - behaviour_logps, corrected, mask, sequences, norm, token_mean),
    }
    return loss, metrics


def correction_metrics(log_rho: jax.Array, corrected, mask: jax.Array, sequences: Sequences, norm: Normalizer,
                       token_mean: Callable[[jax.Array], jax.Array]) -> dict[str, jax.Array]:
    """The off-policy picture of a batch, every step (whatever the correction): token means of
    ρ = π_old/μ and ρ² (the trainer turns them into the effective sample size (Σρ)² / (N Σρ²)), the k3-form
    estimate of KL(π_old ‖ μ) from μ's samples, E_μ[ρ log ρ − ρ + 1], the weights the correction applied,
    and the fractions of tokens it capped or masked and of sequences it masked whole.

    log ρ is clamped to ±LOG_RATIO_BOUND first (float32: a batch's sum of ρ² overflows near log ρ = 44),
    so beyond it is_ess over-reports and kl_old_behaviour under-reports (by 99 % for a token at log ρ = 25);
    `log_ratio_clamped_frac`, the fraction of tokens clamped, says when that happened."""
    log_rho = jax.lax.stop_gradient(log_rho)
    clamped = (jnp.abs(log_rho) > LOG_RATIO_BOUND).astype(log_rho.dtype)
    log_rho = jnp.clip(log_rho, -LOG_RATIO_BOUND, LOG_RATIO_BOUND)
    rho = jnp.exp(log_rho)
    tokens = sequences.per_sequence(mask)
    kept = sequences.per_sequence(mask * corrected.keep)
    return {
        "is_ratio_mean": token_mean(rho),
        "is_ratio_sq_mean": token_mean(rho * rho),
        "kl_old_behaviour": token_mean(rho * log_rho - rho + 1.0),
        "log_ratio_clamped_frac": token_mean(clamped),
        "is_weight_mean": token_mean(corrected.weights * corrected.keep),
        "capped_token_frac": token_mean(corrected.capped),
        "masked_token_frac": token_mean(1.0 - corrected.keep),
        "masked_seq_frac": ((tokens > 0) & (kept == 0)).sum() / jnp.maximum(norm.num_sequences, 1.0),
    }

"""Off-policy corrections (`algo.correction`), chosen independently of the policy loss.

The actors sample with μ (vLLM's numerics, and weights up to `rollout.max_staleness` versions old); the
learner's own evaluation of the policy before this update is π_old. Every correction looks at the ratio

    ρ_t = π_old(y_t) / μ(y_t)        (log ρ_t = old_logps − behaviour_logps)

so it corrects staleness and the training–inference numerics mismatch alike, and returns, per token, a
stop-gradient weight w_t and a keep mask k_t ∈ {0, 1}. The loss becomes Σ k_t · w_t · ℓ_t over the same
normaliser as without the correction (a masked token's term is 0; the denominators do not change, so a
micro-batch still sums to the full batch). With a correction the policy loss takes its trust region
against π_old instead of μ (learner.algo.policy_losses: π_prox).

    token_tis           w_t = min(ρ_t, C)                                     Yao et al. 2025 (TIS)
    icepop              k_t = 1[a ≤ ρ_t ≤ b]                                  IcePop (Ring-1T)
    seq_mask_geo        k_it = 1[a ≤ exp(mean_t log ρ_it) ≤ b]                geometric-mean sequence mask
    seq_tis             w_it = min(Π_t ρ_it, C)                               sequence-level TIS
    offpolicy_seq_mask  k_it = 0 if A_it < 0 and mean_t log(μ/π_old)_it > δ   DeepSeek-V3.2

where i is the sequence of token t (a packed row holds several).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp

from learner.algo.sequences import Sequences
from learner.schema import (
    Correction,
    GeometricSequenceMask,
    IcePop,
    OffPolicySequenceMask,
    SequenceTIS,
    TokenTIS,
)


class Corrected(NamedTuple):
    """A correction's per-token weights w (stop-gradient), keep mask k, and 1 where w was capped."""

    weights: jax.Array
    keep: jax.Array
    capped: jax.Array


CorrectionFn = Callable[[jax.Array, jax.Array, jax.Array, Sequences], Corrected]  # (log ρ, A, mask, seqs)


def _weights(log_w: jax.Array, cap: float) -> Corrected:
    """w = min(exp(log_w), C), computed in log space (a sequence's summed log ratio may overflow exp)."""
    log_cap = jnp.log(jnp.asarray(cap, log_w.dtype))
    return Corrected(jnp.exp(jnp.minimum(log_w, log_cap)), jnp.ones_like(log_w), (log_w > log_cap).astype(log_w.dtype))


def _band(x: jax.Array, low: float, high: float) -> Corrected:
    """Keep where low ≤ x ≤ high."""
    keep = ((x >= low) & (x <= high)).astype(x.dtype)
    return Corrected(jnp.ones_like(x), keep, jnp.zeros_like(x))


def token_tis(log_rho: jax.Array, advantages: jax.Array, mask: jax.Array, seqs: Sequences, c: TokenTIS
              ) -> Corrected:
    return _weights(log_rho, c.cap)


def icepop(log_rho: jax.Array, advantages: jax.Array, mask: jax.Array, seqs: Sequences, c: IcePop) -> Corrected:
    return _band(jnp.exp(log_rho), c.low, c.high)


def seq_mask_geo(log_rho: jax.Array, advantages: jax.Array, mask: jax.Array, seqs: Sequences,
                 c: GeometricSequenceMask) -> Corrected:
    return _band(jnp.exp(seqs.mean(log_rho, mask)), c.low, c.high)


def seq_tis(log_rho: jax.Array, advantages: jax.Array, mask: jax.Array, seqs: Sequences, c: SequenceTIS
            ) -> Corrected:
    return _weights(seqs.total(log_rho * mask), c.cap)


def offpolicy_seq_mask(log_rho: jax.Array, advantages: jax.Array, mask: jax.Array, seqs: Sequences,
                       c: OffPolicySequenceMask) -> Corrected:
    drifted = seqs.mean(-log_rho, mask) > c.delta
    keep = 1.0 - (drifted & (advantages < 0)).astype(log_rho.dtype)
    return Corrected(jnp.ones_like(log_rho), keep, jnp.zeros_like(log_rho))


CORRECTION_FUNCTIONS = {"token_tis": token_tis, "icepop": icepop, "seq_mask_geo": seq_mask_geo,
                        "seq_tis": seq_tis, "offpolicy_seq_mask": offpolicy_seq_mask}


def correct(config: Correction | None, old_logps: jax.Array, behaviour_logps: jax.Array, advantages: jax.Array,
            mask: jax.Array, seqs: Sequences) -> Corrected:
    """The correction `config` names (None: w = 1, k = 1), all stop-gradient."""
    old_logps = jax.lax.stop_gradient(old_logps)
    if config is None:
        ones = jnp.ones_like(old_logps)
        return Corrected(ones, ones, jnp.zeros_like(old_logps))
    corrected = CORRECTION_FUNCTIONS[config.kind](old_logps - behaviour_logps, advantages, mask, seqs, config)
    return Corrected(*(jax.lax.stop_gradient(x) for x in corrected))

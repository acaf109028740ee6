"""Off-policy corrections (`algo.correction`), chosen independently of the policy loss, and the policy the
loss's trust region is taken against under each.

The actors sample with μ (vLLM's numerics, and weights up to `rollout.max_staleness` versions old); the
learner's own evaluation of the policy before this update is π_old, and π_θ the policy being updated.
A correction looks at the per-token ratio

    ρ_t = π_old(y_t) / μ(y_t)        (log ρ_t = old_logps − behaviour_logps)

(DeepSeek-V3.2's mask at the drift log(μ/π_θ) instead) and returns, per token, a stop-gradient weight w_t
and a keep mask k_t ∈ {0, 1}. The loss becomes Σ k_t · w_t · ℓ_t over the same normaliser as without the
correction (a masked token's term is 0; the denominators do not change, so a micro-batch still sums to
the full batch). i is the sequence of token t (a packed row holds several):

    token_tis           w_t = min(ρ_t, C)                                 Yao et al. 2025 (TIS)
    icepop              w_t = M(ρ_t) = ρ_t · 1[α ≤ ρ_t ≤ β]               IcePop (Ring-1T, arXiv 2510.18855;
                                                                      the paper's run: α = 0.5, β = 5)
    token_mask          k_t = 1[a ≤ ρ_t ≤ b]   (no reweighting)           token-level rejection (verl)
    seq_mask_geo        k_it = 1[a ≤ exp(mean_t log ρ_it) ≤ b]            geometric-mean sequence mask
    seq_tis             w_it = min(Π_t ρ_it, C)                           sequence-level TIS
    offpolicy_seq_mask  k_it = 0 if A_i < 0 and                           DeepSeek-V3.2 (arXiv 2512.02556)
                               (1/|o_i|) Σ_t log(μ(y_it) / π_θ(y_it)) > δ

The clip rule (`proximal_logps`): a correction that reweights by π_old/μ (token_tis, icepop, seq_tis) is
the decoupled form, so the loss clips π_θ/π_old and the weight carries the gap to μ; a correction that
only masks (token_mask, seq_mask_geo, offpolicy_seq_mask), like no correction, leaves nothing else to
correct against μ, so the loss clips π_θ/μ, as DeepSeek-V3.2 does. With PPO's clipped ℓ(r) the objective
per token is therefore

    none                  ℓ(π_θ/μ)
    reweighting (w)       w(π_old/μ) · ℓ(π_θ/π_old)
    mask only (k)         k · ℓ(π_θ/μ)
"""

from __future__ import annotations

import dataclasses
import math
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
    TokenMask,
    TokenTIS,
)


class Corrected(NamedTuple):
    """A correction's per-token weights w (stop-gradient), keep mask k, and 1 where w was capped."""

    weights: jax.Array
    keep: jax.Array
    capped: jax.Array


class Drift(NamedTuple):
    """The per-token log ratios corrections look at, stop-gradient, [B, T] each."""

    log_rho: jax.Array  # log π_old(y_t) − log μ(y_t)
    log_behaviour_over_current: jax.Array  # log μ(y_t) − log π_θ(y_t)


def _weights(log_w: jax.Array, cap: float) -> Corrected:
    """w = min(exp(log_w), C), computed in log space (a sequence's summed log ratio may overflow exp)."""
    log_cap = jnp.log(jnp.asarray(cap, log_w.dtype))
    return Corrected(jnp.exp(jnp.minimum(log_w, log_cap)), jnp.ones_like(log_w), (log_w > log_cap).astype(log_w.dtype))


def _band(log_x: jax.Array, low: float, high: float) -> jax.Array:
    """1 where low ≤ exp(log_x) ≤ high."""
    x = jnp.exp(log_x)
    return ((x >= low) & (x <= high)).astype(log_x.dtype)


def _mask(keep: jax.Array) -> Corrected:
    return Corrected(jnp.ones_like(keep), keep, jnp.zeros_like(keep))


def token_tis(d: Drift, advantages: jax.Array, mask: jax.Array, seqs: Sequences, c: TokenTIS) -> Corrected:
    return _weights(d.log_rho, c.cap)


def icepop(d: Drift, advantages: jax.Array, mask: jax.Array, seqs: Sequences, c: IcePop) -> Corrected:
    """M(ρ) = ρ inside [α, β], 0 outside: the weight is ρ clipped into the band (finite however far ρ is),
    and the mask drops the tokens outside it."""
    weights = jnp.exp(jnp.clip(d.log_rho, math.log(c.low), math.log(c.high)))
    return Corrected(weights, _band(d.log_rho, c.low, c.high), jnp.zeros_like(d.log_rho))


def token_mask(d: Drift, advantages: jax.Array, mask: jax.Array, seqs: Sequences, c: TokenMask) -> Corrected:
    return _mask(_band(d.log_rho, c.low, c.high))


def seq_mask_geo(d: Drift, advantages: jax.Array, mask: jax.Array, seqs: Sequences,
                 c: GeometricSequenceMask) -> Corrected:
    return _mask(_band(seqs.mean(d.log_rho, mask), c.low, c.high))


def seq_tis(d: Drift, advantages: jax.Array, mask: jax.Array, seqs: Sequences, c: SequenceTIS) -> Corrected:
    return _weights(seqs.total(d.log_rho * mask), c.cap)


def offpolicy_seq_mask(d: Drift, advantages: jax.Array, mask: jax.Array, seqs: Sequences,
                       c: OffPolicySequenceMask) -> Corrected:
    drifted = seqs.mean(d.log_behaviour_over_current, mask) > c.delta
    return _mask(1.0 - (drifted & (advantages < 0)).astype(d.log_rho.dtype))


@dataclasses.dataclass(frozen=True)
class Rule:
    """A correction's function, and whether it reweights by π_old/μ (then the loss clips against π_old)."""

    fn: Callable[..., Corrected]  # (Drift, A, mask, seqs, its config) -> Corrected
    reweights: bool


RULES: dict[str, Rule] = {
    "token_tis": Rule(token_tis, reweights=True),
    "icepop": Rule(icepop, reweights=True),
    "token_mask": Rule(token_mask, reweights=False),
    "seq_mask_geo": Rule(seq_mask_geo, reweights=False),
    "seq_tis": Rule(seq_tis, reweights=True),
    "offpolicy_seq_mask": Rule(offpolicy_seq_mask, reweights=False),
}


def proximal_logps(config: Correction | None, old_logps: jax.Array, behaviour_logps: jax.Array) -> jax.Array:
    """log π_prox, the policy the loss's trust region is taken against (the module docstring's clip rule):
    π_old under a correction that reweights by π_old/μ, μ otherwise."""
    return old_logps if config is not None and RULES[config.kind].reweights else behaviour_logps


def correct(config: Correction | None, logps: jax.Array, old_logps: jax.Array, behaviour_logps: jax.Array,
            advantages: jax.Array, mask: jax.Array, seqs: Sequences) -> Corrected:
    """The correction `config` names (None: w = 1, k = 1), all stop-gradient; `logps` is π_θ's."""
    if config is None:
        ones = jnp.ones_like(old_logps)
        return Corrected(ones, ones, jnp.zeros_like(old_logps))
    drift = Drift(*(jax.lax.stop_gradient(x) for x in (old_logps - behaviour_logps, behaviour_logps - logps)))
    corrected = RULES[config.kind].fn(drift, advantages, mask, seqs, config)
    return Corrected(*(jax.lax.stop_gradient(x) for x in corrected))

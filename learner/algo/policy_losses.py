"""Policy losses as plug-ins: `@policy_loss("name")` or `"package.module:function"` (`algo.algorithm`).

A policy loss maps one (micro-)batch's per-token terms to a per-token loss ℓ_it, [B, T]; the caller
(learner.algo.losses.rl_loss) applies the off-policy correction's weights and masks, aggregates with the
global batch's normaliser (token-mean, sequence-mean, ...) and adds the KL term. Signature:

    fn(t: PolicyTerms, config: LossConfig, **loss_kwargs) -> (ℓ [B, T], {metric name: [B, T] values})

Each metric is token-meaned over the loss tokens of the global batch by the caller (so it sums over
micro-batches): a loss reports e.g. its ratio and 0/1 clip indicators per token.

Notation, per token t of sequence i (a packed row holds several sequences; `t.sequences` reduces over
each): π_θ the policy being trained (the gradient flows through `t.logps` only), π_old the learner's own
evaluation of the pre-update policy, μ the behaviour policy the actors sampled with, and π_prox the policy
the trust region is taken against: μ without an off-policy correction (PPO on the sampling policy), π_old
with one (the correction then reweights π_old against μ: decoupled PPO). A_it is the advantage.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp

from learner.algo.sequences import Sequences
from learner.schema import ALGORITHMS, LossConfig
from tandem_wire.conventions import import_reference


class PolicyTerms(NamedTuple):
    """What every policy loss receives, [B, T] each."""

    logps: jax.Array  # log π_θ(y_t): carries the gradient
    old_logps: jax.Array  # log π_old(y_t): the learner's pre-update policy (stop-gradient)
    behaviour_logps: jax.Array  # log μ(y_t): what the actors sampled with
    proximal_logps: jax.Array  # log π_prox(y_t): μ, or π_old under an off-policy correction
    advantages: jax.Array  # A_t
    mask: jax.Array  # 1 on the loss's tokens
    sequences: Sequences  # which sequence each token belongs to


LossOutput = tuple[jax.Array, dict[str, jax.Array]]
PolicyLossFn = Callable[..., LossOutput]
_REGISTRY: dict[str, PolicyLossFn] = {}


def policy_loss(name: str) -> Callable[[PolicyLossFn], PolicyLossFn]:
    """Decorator registering a policy loss under `name` (signature: the module docstring)."""
    if not name or ":" in name:
        raise ValueError(f"policy loss name must be non-empty and contain no ':', got {name!r}")

    def register(fn: PolicyLossFn) -> PolicyLossFn:
        if name in _REGISTRY and _REGISTRY[name] is not fn:
            raise ValueError(f"policy loss {name!r} is already registered")
        _REGISTRY[name] = fn
        return fn

    return register


def resolve_policy_loss(config: LossConfig) -> Callable[[PolicyTerms], LossOutput]:
    """`config.algorithm`'s loss bound to the config and `config.loss_kwargs`; a name nobody registered, or
    kwargs the function does not take, fail here (at start), not in the first step."""
    ref = config.algorithm
    fn = import_reference(ref, "policy loss") if ":" in ref else _REGISTRY.get(ref)
    if fn is None:
        raise ValueError(f"unknown policy loss {ref!r}; registered: {sorted(_REGISTRY)} (or 'package.module:function')")
    try:
        inspect.signature(fn).bind(None, config, **config.loss_kwargs)
    except TypeError as error:
        raise ValueError(f"policy loss {ref!r} does not take algo.loss_kwargs={config.loss_kwargs}: {error}") from None
    return lambda terms: fn(terms, config, **config.loss_kwargs)


def clipped(log_r: jax.Array, advantages: jax.Array, config: LossConfig) -> LossOutput:
    """PPO's clipped surrogate as a loss, ℓ = −min(r A, clip(r, 1 − ε_low, 1 + ε_high) A), with its ratio
    and which side clipped."""
    ratio = jnp.exp(log_r)
    loss = -jnp.minimum(ratio * advantages,
                        jnp.clip(ratio, 1.0 - config.epsilon_low, 1.0 + config.epsilon_high) * advantages)
    return loss, _ratio_metrics(ratio, advantages, config)


def _ratio_metrics(ratio: jax.Array, advantages: jax.Array, config: LossConfig) -> dict[str, jax.Array]:
    ratio = jax.lax.stop_gradient(ratio)
    return {"ratio_mean": ratio,
            "clip_frac_low": ((ratio < 1.0 - config.epsilon_low) & (advantages < 0)).astype(ratio.dtype),
            "clip_frac_high": ((ratio > 1.0 + config.epsilon_high) & (advantages > 0)).astype(ratio.dtype)}


@policy_loss("grpo")
def grpo(t: PolicyTerms, config: LossConfig) -> LossOutput:
    """GRPO (DeepSeekMath), PPO's token ratio; with ε_high > ε_low DAPO's clip-higher:

        r_t = π_θ(y_t) / π_prox(y_t)          ℓ_t = −min(r_t A_t, clip(r_t, 1 − ε_low, 1 + ε_high) A_t)
    """
    return clipped(t.logps - t.proximal_logps, t.advantages, config)


@policy_loss("gspo")
def gspo(t: PolicyTerms, config: LossConfig) -> LossOutput:
    """GSPO (Zheng et al. 2025): one length-normalised ratio per sequence, clipped per sequence:

        s_i = exp( (1/|y_i|) Σ_t log(π_θ(y_it) / π_prox(y_it)) )      ℓ_it = −min(s_i A_i, clip(s_i) A_i)
    """
    return clipped(t.sequences.mean(t.logps - t.proximal_logps, t.mask), t.advantages, config)


@policy_loss("gspo-token")
def gspo_token(t: PolicyTerms, config: LossConfig) -> LossOutput:
    """GSPO-token: the value of GSPO's s_i with the gradient of a per-token ratio (per-token advantages):

        s_it = sg[s_i] · π_θ(y_it) / sg[π_θ(y_it)]
    """
    log_s = t.sequences.mean(t.logps - t.proximal_logps, t.mask)
    return clipped(jax.lax.stop_gradient(log_s) + t.logps - jax.lax.stop_gradient(t.logps), t.advantages, config)


@policy_loss("cispo")
def cispo(t: PolicyTerms, config: LossConfig) -> LossOutput:
    """CISPO (MiniMax-M1): REINFORCE with a clipped, stop-gradient importance weight, so no token's
    gradient is dropped by a clip (only its weight is bounded):

        r_t = π_θ(y_t) / π_prox(y_t)          ℓ_t = −sg[clip(r_t, 1 − ε_low, 1 + ε_high)] · A_t · log π_θ(y_t)
    """
    ratio = jnp.exp(t.logps - t.proximal_logps)
    weight = jax.lax.stop_gradient(jnp.clip(ratio, 1.0 - config.epsilon_low, 1.0 + config.epsilon_high))
    return -weight * t.advantages * t.logps, _ratio_metrics(ratio, t.advantages, config)


@policy_loss("decoupled_ppo")
def decoupled_ppo(t: PolicyTerms, config: LossConfig, cap: float = 5.0) -> LossOutput:
    """AReaL's decoupled PPO (Fu et al. 2025): the clip against the learner's own pre-update policy, the
    behaviour gap corrected by an importance weight; tokens whose weight exceeds `cap` leave the loss:

        r_t = π_θ(y_t) / π_old(y_t)      w_t = π_old(y_t) / μ(y_t)
        ℓ_t = 1[w_t ≤ cap] · w_t · −min(r_t A_t, clip(r_t, 1 − ε_low, 1 + ε_high) A_t)
    """
    loss, metrics = clipped(t.logps - t.old_logps, t.advantages, config)
    weight = jnp.exp(t.old_logps - t.behaviour_logps)
    kept = (weight <= cap).astype(loss.dtype)
    return kept * weight * loss, {**metrics, "decoupled_masked_frac": 1.0 - kept}


assert set(ALGORITHMS) <= set(_REGISTRY), "every built-in name the config accepts is registered"

"""Policy losses as plug-ins: `@policy_loss("name")` or `"package.module:function"` (`algo.algorithm`).

A policy loss maps one (micro-)batch's per-token terms to a per-token loss ℓ_it, [B, T]; the caller
(learner.algo.losses.rl_loss) applies the off-policy correction's weights and masks, aggregates with the
global batch's normaliser (token-mean, sequence-mean, ...) and adds the KL term. Signature:

    fn(t: PolicyTerms, config: LossConfig, **loss_kwargs) -> (ℓ [B, T], {metric name: [B, T] values})

Each metric is token-meaned over the loss tokens of the global batch by the caller (so it sums over
micro-batches): a loss reports e.g. its ratio and 0/1 clip indicators per token.

The registry is the one list of names `algo.algorithm` accepts (learner.algo.loss_rules asks it when a
run's config loads and when a Trainer is built): `@policy_loss("name", sequence_ratio=True)` declares a
loss whose ratio is one per sequence (GSPO's), which therefore takes one advantage per sequence
(`algo.advantage: trajectory`). A user's loss is registered the same way (its module imported before the
config is loaded) or named ``"package.module:function"`` (decorated or not; undecorated it is taken to
have a per-token ratio).

Notation, per token t of sequence i (a packed row holds several sequences; `t.sequences` reduces over
each): π_θ the policy being trained (the gradient flows through `t.logps` only), π_old the learner's own
evaluation of the pre-update policy, μ the behaviour policy the actors sampled with, and π_prox the policy
the trust region is taken against (learner.algo.corrections.proximal_logps): μ without an off-policy
correction or with one that only masks (PPO on the sampling policy), π_old with one that reweights by
π_old / μ (decoupled PPO). A_it is the advantage.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp

from learner.algo.sequences import Sequences
from learner.schema import LossConfig
from tandem_wire.conventions import import_reference


class PolicyTerms(NamedTuple):
    """What every policy loss receives, [B, T] each."""

    logps: jax.Array  # log π_θ(y_t): carries the gradient
    old_logps: jax.Array  # log π_old(y_t): the learner's pre-update policy (stop-gradient)
    behaviour_logps: jax.Array  # log μ(y_t): what the actors sampled with
    proximal_logps: jax.Array  # log π_prox(y_t): μ, or π_old under a reweighting off-policy correction
    advantages: jax.Array  # A_t
    mask: jax.Array  # 1 on the loss's tokens
    sequences: Sequences  # which sequence each token belongs to


LossOutput = tuple[jax.Array, dict[str, jax.Array]]
PolicyLossFn = Callable[..., LossOutput]


@dataclasses.dataclass(frozen=True)
class PolicyLoss:
    """A registered policy loss: its function, and whether its ratio is one per sequence."""

    fn: PolicyLossFn
    sequence_ratio: bool = False


_REGISTRY: dict[str, PolicyLoss] = {}
_ATTRIBUTE = "__tandem_policy_loss__"


def policy_loss(name: str, *, sequence_ratio: bool = False) -> Callable[[PolicyLossFn], PolicyLossFn]:
    """Decorator registering a policy loss under `name` (signature: the module docstring); `sequence_ratio`:
    its ratio is one per sequence (GSPO's), so it takes one advantage per sequence."""
    if not name or ":" in name:
        raise ValueError(f"policy loss name must be non-empty and contain no ':', got {name!r}")

    def register(fn: PolicyLossFn) -> PolicyLossFn:
        if name in _REGISTRY and _REGISTRY[name].fn is not fn:
            raise ValueError(f"policy loss {name!r} is already registered")
        _REGISTRY[name] = PolicyLoss(fn, sequence_ratio)
        setattr(fn, _ATTRIBUTE, _REGISTRY[name])
        return fn

    return register


def lookup_policy_loss(ref: str) -> PolicyLoss:
    """The loss `ref` names: a registered name or ``"package.module:function"`` (what the config validates)."""
    if ":" in ref:
        fn = import_reference(ref, "policy loss")
        return getattr(fn, _ATTRIBUTE, None) or PolicyLoss(fn)
    if ref not in _REGISTRY:
        raise ValueError(f"unknown policy loss {ref!r}; registered: {sorted(_REGISTRY)} "
                         "(or 'package.module:function')")
    return _REGISTRY[ref]


def resolve_policy_loss(config: LossConfig) -> Callable[[PolicyTerms], LossOutput]:
    """`config.algorithm`'s loss bound to the config and `config.loss_kwargs`; a name nobody registered, or
    kwargs the function does not take, fail here (at start), not in the first step."""
    ref = config.algorithm
    fn = lookup_policy_loss(ref).fn
    try:
        inspect.signature(fn).bind(None, config, **config.loss_kwargs)
    except TypeError as error:
        raise ValueError(f"policy loss {ref!r} does not take algo.loss_kwargs={config.loss_kwargs}: {error}") from None
    return lambda terms: fn(terms, config, **config.loss_kwargs)


def clipped(log_r: jax.Array, advantages: jax.Array, config: LossConfig) -> LossOutput:
    """PPO's clipped surrogate as a loss, ℓ = −min(r A, clip(r, 1 − ε_low, 1 + ε_high) A), with its ratio
    and which side clipped (a side clips only where A has its sign: elsewhere min keeps r A)."""
    ratio = jnp.exp(log_r)
    loss = -jnp.minimum(ratio * advantages,
                        jnp.clip(ratio, 1.0 - config.epsilon_low, 1.0 + config.epsilon_high) * advantages)
    return loss, _ratio_metrics(ratio, config, low_where=advantages < 0, high_where=advantages > 0)


def _ratio_metrics(ratio: jax.Array, config: LossConfig, low_where: jax.Array | bool = True,
                   high_where: jax.Array | bool = True) -> dict[str, jax.Array]:
    """The ratio and 0/1 indicators of the tokens each side of the clip bounds (where that side applies)."""
    ratio = jax.lax.stop_gradient(ratio)
    return {"ratio_mean": ratio,
            "clip_frac_low": ((ratio < 1.0 - config.epsilon_low) & low_where).astype(ratio.dtype),
            "clip_frac_high": ((ratio > 1.0 + config.epsilon_high) & high_where).astype(ratio.dtype)}


@policy_loss("grpo")
def grpo(t: PolicyTerms, config: LossConfig) -> LossOutput:
    """GRPO (DeepSeekMath), PPO's token ratio; with ε_high > ε_low DAPO's clip-higher:

        r_t = π_θ(y_t) / π_prox(y_t)          ℓ_t = −min(r_t A_t, clip(r_t, 1 − ε_low, 1 + ε_high) A_t)
    """
    return clipped(t.logps - t.proximal_logps, t.advantages, config)


@policy_loss("gspo", sequence_ratio=True)
def gspo(t: PolicyTerms, config: LossConfig) -> LossOutput:
    """GSPO (Zheng et al. 2025): one length-normalised ratio per sequence, clipped per sequence:

        s_i = exp( (1/|y_i|) Σ_t log(π_θ(y_it) / π_prox(y_it)) )      ℓ_it = −min(s_i A_i, clip(s_i) A_i)
    """
    return clipped(t.sequences.mean(t.logps - t.proximal_logps, t.mask), t.advantages, config)


@policy_loss("gspo-token", sequence_ratio=True)
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

    The weight is clipped whatever A's sign, so both clip fractions count every token past their bound.
    The paper's run has no lower bound; the config requires ε_low < 1, so ε_low close to 1 (e.g. 0.999)
    is the nearest this gets to it.
    """
    ratio = jnp.exp(t.logps - t.proximal_logps)
    weight = jax.lax.stop_gradient(jnp.clip(ratio, 1.0 - config.epsilon_low, 1.0 + config.epsilon_high))
    return -weight * t.advantages * t.logps, _ratio_metrics(ratio, config)


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


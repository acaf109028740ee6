"""A user's policy loss, as a user would write one outside the package: referenced in a run's config as
`algo.algorithm: tests.user_policy_loss:reinforce` (with `algo.loss_kwargs: {scale: ...}`)."""

import jax.numpy as jnp


def reinforce(t, config, scale: float = 1.0):
    """Plain REINFORCE on the advantage: ℓ_t = −scale · A_t · log π_θ(y_t); its metric says it ran."""
    return -scale * t.advantages * t.logps, {"reinforce_scale": jnp.full_like(t.logps, scale)}

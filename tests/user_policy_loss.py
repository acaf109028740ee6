"""A user's policy losses, as a user would write them outside the package: `reinforce` referenced in a run's
config as `algo.algorithm: tests.user_policy_loss:reinforce` (with `algo.loss_kwargs: {scale: ...}`), and
the same loss registered by name, `algo.algorithm: user_reinforce`, once this module is imported."""

import jax.numpy as jnp

from learner.algo.policy_losses import policy_loss


def reinforce(t, config, scale: float = 1.0):
    """Plain REINFORCE on the advantage: ℓ_t = −scale · A_t · log π_θ(y_t); its metric says it ran."""
    return -scale * t.advantages * t.logps, {"reinforce_scale": jnp.full_like(t.logps, scale)}


@policy_loss("user_reinforce")
def registered_reinforce(t, config, scale: float = 1.0):
    """`reinforce` under a registered name; its metric is its own, so a test sees which one ran."""
    return -scale * t.advantages * t.logps, {"registered_reinforce_scale": jnp.full_like(t.logps, scale)}

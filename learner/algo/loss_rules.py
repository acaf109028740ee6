"""A loss config checked against the registries: its policy loss and estimator are registered (or import as
`package.module:function`), and their declared properties agree with the rest of the config.

learner.schema's LossConfig checks its own fields and stays free of JAX and of the registries (which load
the losses' JAX code); this check runs when a run's config loads (launch.config) and when a Trainer is
built, so a bad name or combination fails before any model loads.
"""

from __future__ import annotations

from learner.algo.advantages import resolve_estimator
from learner.algo.policy_losses import lookup_policy_loss
from learner.schema import LossConfig


class LossConfigError(ValueError):
    """A loss config the registries refuse; `key` names the field (algorithm, estimator, advantage)."""

    def __init__(self, key: str, message: str):
        super().__init__(message)
        self.key = key


def check_registered(config: LossConfig) -> None:
    """LossConfigError unless `config.algorithm` and `config.estimator` resolve and fit `config.advantage`."""
    try:
        loss = lookup_policy_loss(config.algorithm)
    except ValueError as error:
        raise LossConfigError("algorithm", str(error)) from error
    try:
        estimator = resolve_estimator(config.estimator)
    except ValueError as error:
        raise LossConfigError("estimator", str(error)) from error
    if config.advantage != "trajectory" and loss.sequence_ratio:
        raise LossConfigError("advantage", f"advantage={config.advantage!r} gives each turn its own advantage, but "
                         f"{config.algorithm}'s sequence ratio takes one per sequence: use algorithm='grpo' "
                         "or advantage='trajectory'")
    if config.advantage != "trajectory" and not estimator.group_baseline:
        raise LossConfigError("advantage", f"advantage={config.advantage!r} spreads a group baseline over turns, but "
                         f"{config.estimator}'s baseline is each completion's own (e.g. leave-one-out): use "
                         "advantage='trajectory'")

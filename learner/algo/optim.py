"""Optimizer: optax AdamW with warmup + cosine/constant/WSD schedule and global-norm clipping.

Gradient accumulation is not an optax wrapper here: the train step sums the gradients of k
micro-batch losses (each already divided by the *global* batch normaliser, so their sum is the
full-batch gradient) and applies one update (see learner.algo.train_step). optax.MultiSteps would
average per-micro-batch means instead, which is wrong for token-mean losses with uneven counts.
"""

from __future__ import annotations

import jax
import optax

from learner.schema import OptimizerConfig  # the schema is light (no JAX); see learner.schema


def make_schedule(config: OptimizerConfig) -> optax.Schedule:
    """Learning rate as a function of the number of updates already applied (0 for the first).

    With warmup, update k (1-based) uses base(k), so the first update already has
    lr/warmup_steps rather than 0 (a zero first step would only move Adam's moments).
    cosine: warmup, then cosine decay to learning_rate × min_lr_ratio at total_steps. constant: warmup,
    then the peak. wsd (warmup-stable-decay): warmup, the peak, then a cosine decay to the same floor
    over the last decay_fraction of total_steps.
    """
    peak = config.learning_rate
    if config.schedule == "cosine":
        base = optax.warmup_cosine_decay_schedule(
            init_value=0.0, peak_value=peak, warmup_steps=config.warmup_steps,
            decay_steps=config.total_steps, end_value=peak * config.min_lr_ratio)
    else:
        pieces, boundaries = [optax.constant_schedule(peak)], []
        if config.warmup_steps > 0:
            pieces.insert(0, optax.linear_schedule(0.0, peak, config.warmup_steps))
            boundaries.append(config.warmup_steps)
        if config.schedule == "wsd":
            decay_steps = max(1, round(config.total_steps * config.decay_fraction))
            pieces.append(optax.cosine_decay_schedule(peak, decay_steps, alpha=config.min_lr_ratio))
            boundaries.append(max(config.total_steps - decay_steps, config.warmup_steps))
        base = optax.join_schedules(pieces, boundaries) if boundaries else pieces[0]
    if config.warmup_steps == 0:
        return base
    return lambda count: base(count + 1)


def _decay_mask(params):
    """Weight decay on matrices only (not on norm scales or biases), as in common LLM recipes."""
    return jax.tree.map(lambda p: p.ndim >= 2, params)


def make_optimizer(config: OptimizerConfig) -> optax.GradientTransformation:
    """clip_by_global_norm → AdamW(schedule). The reported grad norm is the pre-clip norm."""
    adamw = optax.adamw(make_schedule(config), b1=config.b1, b2=config.b2, eps=config.eps,
                        weight_decay=config.weight_decay, mask=_decay_mask)
    if config.max_grad_norm is None:
        return adamw
    return optax.chain(optax.clip_by_global_norm(config.max_grad_norm), adamw)

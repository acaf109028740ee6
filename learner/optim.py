"""Optimizer: optax AdamW with warmup + cosine/constant schedule and global-norm clipping.

Gradient accumulation is not an optax wrapper here: the train step sums the gradients of k
micro-batch losses (each already divided by the *global* batch normaliser, so their sum is the
full-batch gradient) and applies one update (see learner.train_step). optax.MultiSteps would
average per-micro-batch means instead, which is wrong for token-mean losses with uneven counts.
"""

from __future__ import annotations

from typing import Literal

import jax
import optax
from pydantic import BaseModel, ConfigDict, Field, model_validator


class OptimizerConfig(BaseModel):
    """AdamW + learning-rate schedule + clipping. `total_steps` is the schedule's horizon."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    learning_rate: float = Field(1e-4, gt=0)
    schedule: Literal["cosine", "constant"] = "cosine"
    warmup_steps: int = Field(0, ge=0)
    total_steps: int = Field(1000, ge=1)
    min_lr_ratio: float = Field(0.1, ge=0, le=1)  # cosine ends at learning_rate * min_lr_ratio
    weight_decay: float = Field(0.0, ge=0)
    b1: float = Field(0.9, ge=0, lt=1)
    b2: float = Field(0.999, ge=0, lt=1)
    eps: float = Field(1e-8, gt=0)
    max_grad_norm: float | None = Field(1.0, gt=0)  # None: no clipping

    @model_validator(mode="after")
    def _warmup_within_horizon(self) -> OptimizerConfig:
        if self.schedule == "cosine" and self.warmup_steps >= self.total_steps:
            raise ValueError(f"warmup_steps ({self.warmup_steps}) must be < total_steps ({self.total_steps})")
        return self


def make_schedule(config: OptimizerConfig) -> optax.Schedule:
    """Learning rate as a function of the number of updates already applied (0 for the first).

    With warmup, update k (1-based) uses base(k), so the first update already has
    lr/warmup_steps rather than 0 (a zero first step would only move Adam's moments).
    """
    peak = config.learning_rate
    if config.schedule == "cosine":
        base = optax.warmup_cosine_decay_schedule(
            init_value=0.0, peak_value=peak, warmup_steps=config.warmup_steps,
            decay_steps=config.total_steps, end_value=peak * config.min_lr_ratio)
    elif config.warmup_steps > 0:
        base = optax.join_schedules(
            [optax.linear_schedule(0.0, peak, config.warmup_steps), optax.constant_schedule(peak)],
            [config.warmup_steps])
    else:
        base = optax.constant_schedule(peak)
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

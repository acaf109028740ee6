"""The learner's config types (loss, optimizer, mesh), light to import: pydantic only, no JAX.

launch.config builds the run's typed config from them without loading JAX; learner.losses,
learner.optim and learner.mesh import them from here. Each field is documented where it is
declared (an attribute docstring or a pydantic description); launch's `--help` prints them.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

Algorithm = Literal["grpo", "gspo", "gspo-token"]
Aggregation = Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "constant"]
DynamicSampling = Literal["off", "drop", "fill", "count"]

ALGORITHMS: tuple[str, ...] = ("grpo", "gspo", "gspo-token")
AGGREGATIONS: tuple[str, ...] = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "constant")
DYNAMIC_SAMPLING: tuple[str, ...] = ("off", "drop", "fill", "count")


@dataclasses.dataclass(frozen=True)
class LossConfig:
    """What to optimise; defaults are DeepSeekMath GRPO with token-mean aggregation and no KL."""

    __pydantic_config__ = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    algorithm: Algorithm = "grpo"
    """'grpo' (per-token ratio), 'gspo' (sequence ratio) or 'gspo-token'"""
    epsilon_low: float = 0.2
    """clip range is [1 - epsilon_low, 1 + epsilon_high]"""
    epsilon_high: float = 0.2
    """upper clip; epsilon_high > epsilon_low is DAPO's clip-higher"""
    beta: float = 0.0
    """k3 KL coefficient to the reference policy; 0 means no reference model"""
    aggregation: Aggregation = "token-mean"
    """'token-mean' (DAPO), 'seq-mean-token-mean' (GRPO and GSPO papers), 'seq-mean-token-sum', 'constant'
    (Dr.GRPO: sum of tokens / (N_seq * constant_normalizer))"""
    constant_normalizer: float | None = None
    """L for aggregation='constant' (e.g. the max completion length)"""
    std_normalize: bool = True
    """divide group-centred rewards by the group std (False: Dr.GRPO)"""
    tis_cap: float | None = None
    """truncated importance sampling cap between the learner's own old logprobs and the actors'
    (behaviour) logprobs; None disables it"""
    dynamic_sampling: DynamicSampling = "off"
    """groups whose rewards are all equal carry no signal: 'drop' removes them from the loss (and its
    denominators); 'fill' (DAPO) has the RL loop retire them and take more groups until the batch is
    full of groups with signal; 'count' keeps them and reports how many there were; 'off' keeps them"""

    def __post_init__(self) -> None:
        if self.algorithm not in ALGORITHMS:
            raise ValueError(f"algorithm must be one of {ALGORITHMS}, got {self.algorithm!r}")
        if self.aggregation not in AGGREGATIONS:
            raise ValueError(f"aggregation must be one of {AGGREGATIONS}, got {self.aggregation!r}")
        if self.dynamic_sampling not in DYNAMIC_SAMPLING:
            raise ValueError(
                f"dynamic_sampling must be one of {DYNAMIC_SAMPLING}, got {self.dynamic_sampling!r}"
            )
        if not (0.0 <= self.epsilon_low < 1.0) or self.epsilon_high < 0.0:
            raise ValueError(
                f"need 0 <= epsilon_low < 1 and epsilon_high >= 0, "
                f"got {self.epsilon_low}, {self.epsilon_high}"
            )
        if self.beta < 0.0:
            raise ValueError(f"beta must be >= 0, got {self.beta}")
        if self.aggregation == "constant" and not (self.constant_normalizer and self.constant_normalizer > 0):
            raise ValueError("aggregation='constant' needs a positive constant_normalizer")
        if self.tis_cap is not None and self.tis_cap <= 0.0:
            raise ValueError(f"tis_cap must be positive or None, got {self.tis_cap}")


class OptimizerConfig(BaseModel):
    """AdamW + learning-rate schedule + clipping. `total_steps` is the schedule's horizon."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    learning_rate: float = Field(1e-4, gt=0, description="peak learning rate (after warmup)")
    schedule: Literal["cosine", "constant"] = Field("cosine", description="decay after warmup")
    warmup_steps: int = Field(0, ge=0, description="linear warmup from 0 over this many updates")
    total_steps: int = Field(1000, ge=1, description="the schedule's horizon (default in a run: train.steps)")
    min_lr_ratio: float = Field(0.1, ge=0, le=1, description="cosine ends at learning_rate * min_lr_ratio")
    weight_decay: float = Field(0.0, ge=0, description="AdamW decoupled weight decay (not on norms, biases)")
    b1: float = Field(0.9, ge=0, lt=1, description="AdamW first-moment decay")
    b2: float = Field(0.999, ge=0, lt=1, description="AdamW second-moment decay")
    eps: float = Field(1e-8, gt=0, description="AdamW epsilon")
    max_grad_norm: float | None = Field(1.0, gt=0, description="global-norm gradient clipping; None: no clipping")

    @model_validator(mode="after")
    def _warmup_within_horizon(self) -> OptimizerConfig:
        if self.schedule == "cosine" and self.warmup_steps >= self.total_steps:
            raise ValueError(f"warmup_steps ({self.warmup_steps}) must be < total_steps ({self.total_steps})")
        return self


class MeshConfig(BaseModel):
    """fsdp × tp sizes; fsdp=None uses every remaining device (device_count // tp)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    fsdp: int | None = Field(None, ge=1, description="data/parameter-sharding axis; None: device_count // tp")
    tp: int = Field(1, ge=1, description="tensor-parallel axis")

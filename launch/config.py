"""The one typed configuration of a tandem run, read from YAML with `key=value` overrides.

Every section forbids unknown keys, so a typo fails at start with the key's full dotted name;
bad values fail with pydantic's message (which lists the allowed values of a choice).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class TinyModelConfig(Section):
    """A model created from scratch by models.tiny (used when `model.path` is empty)."""

    family: Literal["qwen2", "qwen3", "llama3"] = "qwen2"
    num_layers: int = Field(3, ge=1)
    hidden_size: int = Field(128, ge=8)
    intermediate_size: int = Field(384, ge=8)
    num_heads: int = Field(4, ge=1)
    num_kv_heads: int = Field(2, ge=1)
    head_dim: int = Field(32, ge=4)
    tie_word_embeddings: bool = False
    max_position_embeddings: int = Field(256, ge=16)


class ModelConfig(Section):
    path: str | None = Field(None, description="HF model dir (config.json, *.safetensors, tokenizer)")
    tiny: TinyModelConfig = TinyModelConfig()
    dtype: Literal["float32", "bfloat16"] = "float32"


class MeshConfig(Section):
    fsdp: int = Field(1, ge=1)
    tp: int = Field(1, ge=1)


class DataConfig(Section):
    """Where examples come from: local jsonl/parquet/arrow files or a hub dataset name.

    rl: rows with `prompt` (user text) and `answer`; sft: rows with `messages`;
    pretrain: rows with `text`. `task: arithmetic` generates the demo's data under run_dir.
    """

    task: Literal["none", "arithmetic"] = "none"
    train: str | None = None
    eval: str | None = None
    split: str = "train"
    max_seq_len: int = Field(64, ge=8)
    eval_examples: int = Field(256, ge=1)


class OptimConfig(Section):
    learning_rate: float = Field(1e-3, gt=0)
    schedule: Literal["cosine", "constant"] = "cosine"
    warmup_steps: int = Field(0, ge=0)
    min_lr_ratio: float = Field(0.1, ge=0, le=1)
    weight_decay: float = Field(0.0, ge=0)
    clip_norm: float = Field(1.0, gt=0)
    b1: float = 0.9
    b2: float = 0.95


class TrainConfig(Section):
    steps: int = Field(100, ge=1)
    batch_size: int = Field(64, ge=1, description="sequences per step (sft, pretrain)")
    prompts_per_step: int = Field(16, ge=1, description="groups per step (rl)")
    micro_batches: int = Field(1, ge=1)
    checkpoint_every: int = Field(50, ge=1)
    keep_checkpoints: int = Field(2, ge=1)
    eval_every: int = Field(0, ge=0, description="0 = only at the end")
    log_every: int = Field(1, ge=1)
    logprob_chunk: int = Field(64, ge=1)


class AlgoConfig(Section):
    algorithm: Literal["grpo", "gspo", "gspo-token"] = "grpo"
    epsilon_low: float = Field(0.2, ge=0)
    epsilon_high: float = Field(0.28, ge=0)
    beta: float = Field(0.0, ge=0, description="k3 KL coefficient; 0 loads no reference model")
    aggregation: Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "constant"] = "token-mean"
    constant_normalizer: float | None = None
    std_normalize: bool = True
    tis_cap: float | None = None
    dynamic_sampling: Literal["off", "drop", "count"] = "count"


class RolloutConfig(Section):
    num_actors: int = Field(1, ge=0)
    group_size: int = Field(8, ge=1)
    temperature: float = Field(1.0, gt=0)
    top_p: float = Field(1.0, gt=0, le=1)
    max_tokens: int = Field(16, ge=1)
    max_prompt_tokens: int = Field(48, ge=1)
    max_model_len: int = Field(128, ge=16)
    kv_cache_gib: float = Field(1.0, gt=0)
    max_staleness: int = Field(1, ge=0)
    publish_every: int = Field(1, ge=1)
    queue_capacity: int = Field(64, ge=1)
    lease_seconds: float = Field(60.0, gt=0)
    actor_num_cpus: float = Field(1.0, ge=0)


class RewardFunctionConfig(Section):
    ref: str = Field(description="registered name or package.module:function")
    weight: float = 1.0


class RewardsConfig(Section):
    functions: list[RewardFunctionConfig] = [RewardFunctionConfig(ref="exact_match")]
    num_workers: int = Field(1, ge=1)
    timeout_s: float = Field(5.0, gt=0)


class ServerConfig(Section):
    host: str = "127.0.0.1"
    port: int = Field(0, ge=0, le=65535, description="0 = any free port")
    auth_token: str | None = Field(None, description="shared token; defaults to $TANDEM_AUTH_TOKEN")


class TandemConfig(Section):
    mode: Literal["rl", "sft", "pretrain"] = "rl"
    run_dir: str = "runs/default"
    seed: int = 0
    init_from: str | None = Field(None, description="HF dir to start from (overrides model.path)")
    ray_address: str | None = Field(None, description="None = connect to a running cluster or start a local one")
    model: ModelConfig = ModelConfig()
    mesh: MeshConfig = MeshConfig()
    data: DataConfig = DataConfig()
    optim: OptimConfig = OptimConfig()
    train: TrainConfig = TrainConfig()
    algo: AlgoConfig = AlgoConfig()
    rollout: RolloutConfig = RolloutConfig()
    rewards: RewardsConfig = RewardsConfig()
    server: ServerConfig = ServerConfig()

    @model_validator(mode="after")
    def _token_from_environment(self) -> TandemConfig:
        if self.server.auth_token is None and os.environ.get("TANDEM_AUTH_TOKEN"):
            self.server.auth_token = os.environ["TANDEM_AUTH_TOKEN"]
        return self


class ConfigError(ValueError):
    """A config that cannot be used; the message names the key and what is allowed."""


def apply_override(tree: dict[str, Any], assignment: str) -> None:
    """Apply one `dotted.key=value` override; the value is parsed as YAML (numbers, lists, null)."""
    if "=" not in assignment:
        raise ConfigError(f"override {assignment!r} is not of the form key=value")
    key, raw = assignment.split("=", 1)
    parts = key.strip().split(".")
    node = tree
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"override {key!r}: {part!r} is not a section")
        node = child
    node[parts[-1]] = yaml.safe_load(raw) if raw.strip() else None


def format_validation_error(error: ValidationError) -> str:
    lines = []
    for item in error.errors():
        key = ".".join(str(p) for p in item["loc"])
        if item["type"] == "extra_forbidden":
            lines.append(f"unknown key '{key}'")
        else:
            lines.append(f"'{key}': {item['msg']} (got {item.get('input')!r})")
    return "invalid config:\n  " + "\n  ".join(lines)


def load_config(path: str | Path | None, overrides: list[str] = ()) -> TandemConfig:
    """Read YAML (or start from the defaults), apply overrides, validate."""
    tree: dict[str, Any] = {}
    if path is not None:
        loaded = yaml.safe_load(Path(path).read_text())
        if loaded is not None and not isinstance(loaded, dict):
            raise ConfigError(f"{path}: top level must be a mapping")
        tree = loaded or {}
    for assignment in overrides:
        apply_override(tree, assignment)
    try:
        return TandemConfig.model_validate(tree)
    except ValidationError as error:
        raise ConfigError(format_validation_error(error)) from None

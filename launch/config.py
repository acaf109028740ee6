"""The one typed configuration of a tandem run, read from YAML with `key=value` overrides.

Sections are the roles' own config types (learner.losses.LossConfig, learner.optim.OptimizerConfig,
learner.mesh.MeshConfig, actors.config.ActorConfig, rewards.spec.RewardSpec) plus launch's own.
Every section forbids unknown keys, so a typo fails at start with the key's full dotted name;
bad values fail with pydantic's message (which lists the allowed values of a choice).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from actors.config import FLEET_NAME, ActorConfig, RestartPolicy
from learner.guard import GuardConfig
from learner.losses import LossConfig
from learner.mesh import MeshConfig
from learner.optim import OptimizerConfig
from rewards.spec import RewardSpec, WeightedReward


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
    head_dim: int = Field(32, ge=32, description="vLLM's CPU attention needs >= 32")
    tie_word_embeddings: bool = False
    max_position_embeddings: int = Field(256, ge=16)


class ModelConfig(Section):
    path: str | None = Field(None, description="HF model dir (config.json, *.safetensors, tokenizer)")
    tiny: TinyModelConfig = TinyModelConfig()
    dtype: Literal["float32", "bfloat16"] = "float32"


class DataConfig(Section):
    """Where examples come from: local jsonl/parquet/arrow files or a hub dataset name.

    rl: rows with `prompt` (user text) and `answer`; sft: rows with `messages`;
    pretrain: rows with `text`. `task: arithmetic` generates the demo's data under run_dir.
    """

    task: Literal["none", "arithmetic"] = "none"
    digits: int = Field(3, ge=1, le=6, description="task=arithmetic: digits per operand")
    dir: str | None = Field(None, description="where task data is generated (default: run_dir/data)")
    train: str | None = None
    eval: str | None = None
    split: str = "train"
    seq_len: int = Field(64, ge=8, description="packed row length (sft, pretrain)")
    eval_examples: int = Field(256, ge=1)


class TrainConfig(Section):
    steps: int = Field(100, ge=1)
    batch_size: int = Field(64, ge=1, description="packed rows per step (sft, pretrain)")
    prompts_per_step: int = Field(16, ge=1, description="groups per step (rl)")
    micro_batches: int = Field(1, ge=1)
    checkpoint_every: int = Field(50, ge=1)
    keep_checkpoints: int = Field(2, ge=1)
    eval_every: int = Field(0, ge=0, description="0 = only at the end")
    eval_k: int = Field(8, ge=1, description="samples per prompt for pass@k")
    logprob_chunk: int = Field(64, ge=1)
    skip_no_signal: bool = Field(True, description="rl: a step whose advantages are all zero makes no "
                                                   "optimizer update (AdamW's state untouched)")
    max_fill_batches: int = Field(4, ge=1, description="rl, algo.dynamic_sampling=fill: take at most this "
                                                       "many × prompts_per_step groups per step")
    guard: GuardConfig = Field(GuardConfig(), description="rl: entropy / update-norm jump guard")


class RolloutConfig(ActorConfig):
    """The actors' engine and sampling settings (actors.config.ActorConfig) plus the fleet's."""

    hf_dir: str = Field("", description="filled in by launch from the model being trained")
    num_actors: int = Field(1, ge=0)
    max_staleness: int = Field(1, ge=0)
    publish_every: int = Field(1, ge=1)
    queue_capacity: int = Field(64, ge=1)
    lease_seconds: float = Field(60.0, gt=0)
    heartbeat_interval_s: float = Field(5.0, gt=0, description="how often actors report liveness")
    actor_timeout_s: float = Field(30.0, gt=0, description="an actor silent this long is replaced")
    generate_timeout_s: float = Field(600.0, gt=0, description="an engine busy this long in one generate "
                                                               "call counts as hung and is replaced")
    restart: RestartPolicy = RestartPolicy()
    fleet_name: str = Field(FLEET_NAME, min_length=1, description="Ray name of the run's detached fleet; "
                                                                  "runs sharing a cluster need their own")
    orphan_timeout_s: float = Field(600.0, ge=0, description="a fleet whose driver died waits this long "
                                                             "for a restarted driver, then shuts down "
                                                             "(0 = wait forever)")

    def actor_config(self, hf_dir: str, auth_token: str | None, tls_ca_path: str | None = None) -> ActorConfig:
        fields = self.model_dump(include=set(ActorConfig.model_fields))
        return ActorConfig(**{**fields, "hf_dir": hf_dir, "auth_token": auth_token, "tls_ca_path": tls_ca_path})


class RewardsConfig(RewardSpec):
    """Reward functions (rewards.spec.RewardSpec) plus how many isolated workers score them."""

    functions: list[WeightedReward] = Field(default_factory=lambda: [WeightedReward(ref="exact_match")],
                                            min_length=1)
    num_workers: int = Field(1, ge=1)

    def spec(self) -> RewardSpec:
        return RewardSpec(**self.model_dump(include=set(RewardSpec.model_fields)))


class ServerConfig(Section):
    host: str = "127.0.0.1"
    port: int = Field(0, ge=0, le=65535, description="0 = any free port")
    auth_token: str | None = Field(None, description="shared token; defaults to $TANDEM_AUTH_TOKEN")
    tls_cert_path: str | None = Field(None, description="learner certificate: serve TLS only (with tls_key_path)")
    tls_key_path: str | None = None
    tls_ca_path: str | None = Field(None, description="CA that signed tls_cert_path, handed to the rollout actors")


class TandemConfig(Section):
    mode: Literal["rl", "sft", "pretrain"] = "rl"
    run_dir: str = "runs/default"
    seed: int = 0
    ray_address: str | None = Field(None, description="None = the job's cluster, else a local Ray")
    model: ModelConfig = ModelConfig()
    mesh: MeshConfig = MeshConfig()
    data: DataConfig = DataConfig()
    optim: OptimizerConfig = OptimizerConfig()
    train: TrainConfig = TrainConfig()
    algo: LossConfig = LossConfig()
    rollout: RolloutConfig = RolloutConfig()
    rewards: RewardsConfig = RewardsConfig()
    server: ServerConfig = ServerConfig()

    @model_validator(mode="after")
    def _derived_defaults(self) -> TandemConfig:
        if self.server.auth_token is None and os.environ.get("TANDEM_AUTH_TOKEN"):
            self.server.auth_token = os.environ["TANDEM_AUTH_TOKEN"]
        if self.rollout.sync and (self.rollout.max_staleness != 0 or self.train.prompts_per_step
                                  != self.rollout.num_actors * self.rollout.prompts_per_batch):
            raise ValueError("rollout.sync needs rollout.max_staleness=0 and train.prompts_per_step == "
                             "rollout.num_actors * rollout.prompts_per_batch (each step trains on exactly "
                             "what the actors sampled with the newest weights)")
        if "total_steps" not in self.optim.model_fields_set:  # the schedule spans the run by default
            self.optim = self.optim.model_copy(update={"total_steps": self.train.steps})
            OptimizerConfig.model_validate(self.optim.model_dump())
        return self


class ConfigError(ValueError):
    """A config that cannot be used; the message names the key and what is allowed."""


class ConfigLoader(yaml.SafeLoader):
    """PyYAML's safe loader with YAML 1.2's booleans: only true/false. YAML 1.1 also reads on/off/yes/no
    as booleans, which turned `dynamic_sampling: off` into False; here they stay words, and pydantic
    still reads them as booleans where a field is one."""


BOOL_TAG = "tag:yaml.org,2002:bool"
ConfigLoader.yaml_implicit_resolvers = {
    first: [(tag, pattern) for tag, pattern in resolvers if tag != BOOL_TAG]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
ConfigLoader.add_implicit_resolver(BOOL_TAG, re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF"))


def parse_yaml(text: str) -> Any:
    return yaml.load(text, Loader=ConfigLoader)


def apply_override(tree: dict[str, Any], assignment: str) -> None:
    """Apply one `dotted.key=value` override; the value is parsed as YAML (numbers, lists, null,
    true/false)."""
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
    node[parts[-1]] = parse_yaml(raw) if raw.strip() else None


def format_validation_error(error: ValidationError) -> str:
    lines = []
    for item in error.errors():
        key = ".".join(str(p) for p in item["loc"])
        if item["type"] in ("extra_forbidden", "unexpected_keyword_argument"):
            lines.append(f"unknown key '{key}'")
        else:
            lines.append(f"'{key}': {item['msg']} (got {item.get('input')!r})")
    return "invalid config:\n  " + "\n  ".join(lines)


def load_config(path: str | Path | None, overrides: list[str] = ()) -> TandemConfig:
    """Read YAML (or start from the defaults), apply overrides, validate."""
    tree: dict[str, Any] = {}
    if path is not None:
        loaded = parse_yaml(Path(path).read_text())
        if loaded is not None and not isinstance(loaded, dict):
            raise ConfigError(f"{path}: top level must be a mapping")
        tree = loaded or {}
    for assignment in overrides:
        apply_override(tree, assignment)
    try:
        return TandemConfig.model_validate(tree)
    except ValidationError as error:
        raise ConfigError(format_validation_error(error)) from None

"""The one typed configuration of a tandem run, read from YAML with `key=value` overrides.

Every role's config is derived from it here and nowhere else: `service_config` (the learner's gRPC
server), `loop_config` (the RL loop), `actor_config` (each rollout actor) and `eval_settings` (the
held-out evaluator); what exists only at run time (the model's vocab size, the model dir) is an
argument. Sections that belong to one role are that role's own types, declared in light modules
and handed to it whole: `train` (learner.schema.TrainConfig, read by the RL loop), `server`
(learner.schema.ServerConfig, read by the service), `algo`, `optim`, `mesh`, `distributed` (learner.schema),
`train.guard` (learner.guard), `rollout.restart` (actors.config), `rewards` (rewards.spec), `logging`
(learner.tracking.config, the experiment trackers). A new
option there is one field in its section plus its use. The `rollout` section is shared: its class
extends the actors' (actors.config.EngineSettings, picked by name into each ActorConfig) and the
service's (learner.schema.AdmissionSettings, handed to it whole), so a new option there, too, is one
field in its owner's class plus its use. Every default lives once, and each field is documented
where it is declared; `config_help()` (printed by every entrypoint's `--help`) lists them all.

Every section forbids unknown keys, so a typo fails at start with the key's full dotted name; a
removed key fails naming what replaced it; bad values fail with pydantic's message (which lists the
allowed values of a choice). Importing this module loads neither JAX nor tunix.
"""

from __future__ import annotations

import dataclasses
import os
import re
import types
import typing
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, model_validator
from pydantic_core import PydanticUndefined

from actors.config import FLEET_NAME, ActorConfig, EngineSettings, RestartPolicy
from learner.algo.turn_advantages import resolve_turn_advantage
from learner.chat_format import ChatFormat
from learner.schema import (
    AdmissionSettings,
    DistributedConfig,
    LossConfig,
    MeshConfig,
    OptimizerConfig,
    RLLoopConfig,
    Section,
    ServerConfig,
    ServiceConfig,
    TrainConfig,
)
from learner.tracking.config import LoggingConfig
from models.peft import LoraConfig
from rewards.spec import RewardSpec, WeightedReward
from rewards.tools import template_tools


class TinyModelConfig(Section):
    """A model created from scratch by models.tiny (used when `model.path` is empty)."""

    family: Literal["qwen2", "qwen3", "llama3"] = Field("qwen2", description="architecture (and chat template)")
    num_layers: int = Field(3, ge=1, description="decoder layers")
    hidden_size: int = Field(128, ge=8, description="residual width")
    intermediate_size: int = Field(384, ge=8, description="MLP width")
    num_heads: int = Field(4, ge=1, description="query heads")
    num_kv_heads: int = Field(2, ge=1, description="key/value heads (grouped-query attention)")
    head_dim: int = Field(32, ge=32, description="per-head width; vLLM's CPU attention needs >= 32")
    tie_word_embeddings: bool = Field(False, description="share the input embedding with the output head")
    max_position_embeddings: int = Field(256, ge=16, description="longest sequence the model is built for")


class ModelConfig(Section):
    """The model trained (and sampled by the actors)."""

    path: str | None = Field(None, description="HF model dir (config.json, *.safetensors, tokenizer); "
                                               "empty: a tiny model made from model.tiny")
    tiny: TinyModelConfig = Field(TinyModelConfig(), description="the from-scratch model (model.path empty)")
    dtype: Literal["float32", "bfloat16"] = Field("float32", description="compute dtype: the learner's "
                                                                         "forward and backward passes, the "
                                                                         "rollout engines, the evaluator and "
                                                                         "every exported weight version")
    param_dtype: Literal["float32", "bfloat16"] = Field(
        "float32", description="the learner's master weights and AdamW moments (and checkpoints). float32 "
                               "with dtype bfloat16 is mixed precision: a bf16 copy of the weights runs "
                               "each step, the update lands in float32. bfloat16 here rounds away every "
                               "update below half a bf16 ulp of its weight (most of them at lr <= 1e-5)")
    lora: LoraConfig | None = Field(None, description="train LoRA adapters instead of every weight "
                                                      "(models.peft.LoraConfig: rank, alpha, dropout, targets): "
                                                      "the base stays frozen in dtype, the adapters' master and "
                                                      "AdamW in param_dtype, weight versions are the adapters "
                                                      "only, runs export hf_final (merged) and adapter_final "
                                                      "(PEFT); e.g. {rank: 16} with ~10x the full learning "
                                                      "rate (docs/demo.md); null: full fine-tuning")


class DataConfig(ChatFormat):
    """Where examples come from: local jsonl/parquet/arrow files or a hub dataset name, and which
    columns hold what (learner.chat_format.ChatFormat declares the prompt's columns and template).

    rl and eval: rows with the user text (`prompt_field`) and the reference answer (`answer_field`),
    asked as [system_prompt?, user(prompt_template)]; sft: rows with `messages` (rows there with `text`
    instead are plain-text documents replayed among the chats), or prompt/completion rows
    (`prompt_field`, `completion_field`) asked the same way; pretrain: rows with `text`.
    `task: arithmetic` generates the demo's data under data.dir, `task: chain` the countdown chains of
    the RL loop's benchmarks (launch/chains.py: answers of long-tailed lengths).
    """

    task: Literal["none", "arithmetic", "chain"] = Field("none", description="arithmetic: generate the demo's "
                                                                             "data; chain: countdown chains "
                                                                             "(launch/chains.py)")
    digits: int = Field(3, ge=1, le=6, description="task=arithmetic: digits per operand")
    max_terms: int = Field(64, ge=1, le=200, description="task=chain: most numbers in an answer (about 4 "
                                                         "tokens each)")
    dir: str | None = Field(None, description="where task data is generated (default: run_dir/data)")
    train: str | None = Field(None, description="training data: files or a hub dataset name")
    eval: str | None = Field(None, description="held-out data (rows with data.prompt_field, data.answer_field)")
    split: str = Field("train", description="split of data.train to read")
    seq_len: int = Field(64, ge=8, description="packed row length (sft, pretrain)")
    eval_examples: int = Field(256, ge=1, description="held-out examples evaluated at most")
    answer_field: str = Field("answer", min_length=1, description="rl, eval: column holding the reference "
                                                                  "answer; reward functions read it as "
                                                                  "metadata['answer'] whatever its name")


class RolloutConfig(EngineSettings, AdmissionSettings, Section):
    """The rollout actors' engine and sampling settings (actors.config.EngineSettings), the learner
    service's admission (learner.schema.AdmissionSettings) and the fleet's supervision (rl)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, frozen=False)

    num_actors: int = Field(1, ge=0, description="rollout actors in the fleet")
    publish_every: int = Field(1, ge=1, description="publish new weights every this many steps")
    generate_timeout_s: float = Field(600.0, gt=0, description="an engine busy this long in one call (a "
                                                               "streaming step, or a sync-mode generate) counts as "
                                                               "hung and is replaced")
    restart: RestartPolicy = Field(RestartPolicy(), description="how actors that keep failing are replaced")
    fleet_name: str = Field(FLEET_NAME, min_length=1, description="Ray name of the run's detached fleet; "
                                                                  "runs sharing a cluster need their own")
    orphan_timeout_s: float = Field(600.0, ge=0, description="a fleet whose driver died waits this long "
                                                             "for a restarted driver, then shuts down "
                                                             "(0 = wait forever)")


class RewardsConfig(RewardSpec):
    """Reward functions (rewards.spec.RewardSpec) plus how many isolated workers score them."""

    functions: list[WeightedReward] = Field(default_factory=lambda: [WeightedReward(ref="exact_match")],
                                            min_length=1, description="weighted reward functions, e.g. "
                                                                      "[{ref: math_answer, weight: 1.0}]")
    num_workers: int = Field(1, ge=1, description="isolated reward worker processes (Ray actors)")

    def spec(self) -> RewardSpec:
        """The workers' spec; an environment's tool schemas resolved (its module imported) for every role."""
        spec = RewardSpec(**self.model_dump(include=set(RewardSpec.model_fields)))
        if spec.environment is None or spec.environment.tools is not None:
            return spec
        environment = spec.environment.model_copy(update={"tools": template_tools(spec) or []})
        return spec.model_copy(update={"environment": environment})

    def template_tools(self) -> list[dict] | None:
        """The tool schemas every chat template of the run gets (`tools=`); None without tools."""
        environment = self.spec().environment
        return (environment.tools or None) if environment is not None else None


class TandemConfig(Section):
    """A whole run; the entrypoint (launch/rl.py, sft.py, pretrain.py, eval.py) chooses the mode."""

    run_dir: str = Field("runs/default", description="checkpoints, logs, exported models and summary")
    seed: int = Field(0, description="data order, model init, sampling and the demo's generated data")
    ray_address: str | None = Field(None, description="None = the job's cluster, else a local Ray")
    model: ModelConfig = Field(ModelConfig(), description=ModelConfig.__doc__)
    mesh: MeshConfig = Field(MeshConfig(), description="the learner's device mesh")
    distributed: DistributedConfig = Field(DistributedConfig(), description=DistributedConfig.__doc__)
    data: DataConfig = Field(DataConfig(), description="training and held-out data")
    optim: OptimizerConfig = Field(OptimizerConfig(), description="AdamW and its schedule")
    train: TrainConfig = Field(TrainConfig(), description=TrainConfig.__doc__)
    algo: LossConfig = Field(default_factory=LossConfig, description="the policy-gradient loss (rl)")
    rollout: RolloutConfig = Field(RolloutConfig(), description="actors, admission and the fleet (rl)")
    rewards: RewardsConfig = Field(RewardsConfig(), description="reward functions and workers (rl, eval)")
    server: ServerConfig = Field(ServerConfig(), description=ServerConfig.__doc__)
    logging: LoggingConfig = Field(LoggingConfig(), description=LoggingConfig.__doc__)

    @model_validator(mode="after")
    def _derived_defaults(self) -> TandemConfig:
        if self.server.auth_token is None and os.environ.get("TANDEM_AUTH_TOKEN"):
            self.server.auth_token = os.environ["TANDEM_AUTH_TOKEN"]
        if self.rollout.sync and (self.rollout.max_staleness != 0 or self.train.prompts_per_step
                                  != self.rollout.num_actors * self.rollout.prompts_per_batch):
            raise ValueError("rollout.sync needs rollout.max_staleness=0 and train.prompts_per_step == "
                             "rollout.num_actors * rollout.prompts_per_batch (each step trains on exactly "
                             "what the actors sampled with the newest weights)")
        if self.rewards.environment is not None and self.rollout.sync:
            raise ValueError("rewards.environment (multi-turn episodes) needs the streaming actors: "
                             "set rollout.sync=false")
        resolve_turn_advantage(self.algo.advantage)  # a bad name fails at load, not after the model loads
        from learner.algo.loss_rules import LossConfigError, check_registered  # the registries load JAX: not at import

        try:
            check_registered(self.algo)
        except LossConfigError as error:
            raise ValueError(f"'algo.{error.key}': {error}") from error
        if "total_steps" not in self.optim.model_fields_set:  # the schedule spans the run by default
            self.optim = self.optim.model_copy(update={"total_steps": self.train.steps})
            OptimizerConfig.model_validate(self.optim.model_dump())
        return self

    # The roles' configs, derived here and nowhere else.

    @property
    def completion_tokens(self) -> int:
        """Tokens after the prompt a sample may have: rollout.max_tokens, or with an environment its
        episode's max_total_tokens (every turn and observation)."""
        environment = self.rewards.environment
        return self.rollout.max_tokens if environment is None else environment.max_total_tokens

    def service_config(self, *, vocab_size: int | None) -> ServiceConfig:
        """The learner's gRPC server; ``vocab_size`` is the model's (token ids are checked against it)."""
        rollout = self.rollout
        return ServiceConfig(
            server=self.server, admission=rollout, prompts_per_step=self.train.prompts_per_step,
            group_size=rollout.group_size, max_prompt_tokens=rollout.max_prompt_tokens, vocab_size=vocab_size,
            max_sequence_tokens=rollout.max_prompt_tokens + self.completion_tokens, mode="rl")

    def loop_config(self) -> RLLoopConfig:
        """The learner's RL loop (the tokenizer's pad id is RLLoop's own argument)."""
        train, rollout = self.train, self.rollout
        return RLLoopConfig(
            train=train, group_size=rollout.group_size, publish_every=rollout.publish_every,
            max_sequence_len=rollout.max_prompt_tokens + self.completion_tokens, loss=self.algo)

    def actor_config(self, model_dir: str | Path) -> ActorConfig:
        """What each rollout actor runs; ``model_dir`` is the model being trained (weight version 0)."""
        engine = self.rollout.model_dump(include=set(EngineSettings.model_fields))
        return ActorConfig(**engine, hf_dir=str(model_dir), dtype=self.model.dtype, seed=self.seed,
                           auth_token=self.server.auth_token, tls_ca_path=self.server.tls_ca_path,
                           environment=self.rewards.spec().environment, lora=self.model.lora,
                           lora_versions_kept=self.rollout.max_staleness + 1)

    def eval_settings(self) -> dict[str, Any]:
        """Keyword arguments of launch.evaluation.Evaluator (besides the model, examples and scorer)."""
        rollout = self.rollout
        temperature = rollout.temperature if self.train.eval_temperature is None else self.train.eval_temperature
        return {"k": self.train.eval_k, "max_tokens": rollout.max_tokens, "temperature": temperature,
                "max_model_len": rollout.max_model_len, "kv_cache_gib": self.train.eval_kv_cache_gib,
                "dtype": self.model.dtype, "seed": self.seed}


# Keys that were dropped; a config still using one fails with what to do instead.
REMOVED_KEYS = {
    "mode": "the entrypoint chooses the mode (launch/rl.py, sft.py, pretrain.py, eval.py)",
    "rollout.hf_dir": "the actors start from the model being trained (model.path, or the tiny model)",
    "rollout.dtype": "use model.dtype (the learner, the actors and the evaluator share it)",
    "rollout.seed": "use seed",
    "train.logprob_chunk": "use train.logits_chunk_tokens (tokens, rows × time steps, per unembedding chunk)",
    "rollout.auth_token": "use server.auth_token",
    "rollout.tls_ca_path": "use server.tls_ca_path",
    "algo.tis_cap": "use algo.correction={kind: token_tis, cap: C} (its ratio is the learner's own pre-update policy "
                    "over the actors')",
    "algo.std_normalize": "use algo.estimator: grpo (divides by the group's std) or dr_grpo (does not)",
}


@dataclasses.dataclass(frozen=True)
class KeyDoc:
    key: str
    default: Any
    description: str


def section_type(annotation: Any) -> type | None:
    """`annotation` when it is a config section (a pydantic model or a dataclass), else None."""
    if isinstance(annotation, type) and (issubclass(annotation, BaseModel) or dataclasses.is_dataclass(annotation)):
        return annotation
    return None


def optional_section(annotation: Any) -> type | None:
    """The section of a `Section | None` field (e.g. rewards.environment), else None."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        inner = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(inner) == 1 and len(typing.get_args(annotation)) == 2:
            return section_type(inner[0])
    return None


def section_fields(section: type) -> list[tuple[str, Any, Any, str]]:
    """(name, annotation, default, description) of each field of a pydantic model or dataclass section
    (--help and docs/config.md both read them here)."""
    if issubclass(section, BaseModel):
        return [(name, f.annotation, f.get_default(call_default_factory=True), f.description or "")
                for name, f in section.model_fields.items()]
    hints = typing.get_type_hints(section)
    properties = TypeAdapter(section).json_schema().get("properties", {})
    return [(f.name, hints[f.name], _default(f), properties.get(f.name, {}).get("description", ""))
            for f in dataclasses.fields(section)]


def _default(field: dataclasses.Field) -> Any:
    return field.default_factory() if field.default_factory is not dataclasses.MISSING else field.default


def documented_keys(section: type = TandemConfig, prefix: str = "") -> list[KeyDoc]:
    """Every settable dotted key under ``section``, with its default and its documentation."""
    out: list[KeyDoc] = []
    for name, annotation, default, description in section_fields(section):
        nested = section_type(annotation)
        if nested is not None:
            out += documented_keys(nested, f"{prefix}{name}.")
        else:
            out.append(KeyDoc(prefix + name, default, " ".join(description.split())))
            optional = optional_section(annotation)
            if optional is not None:  # unset by default; its keys set it
                out += documented_keys(optional, f"{prefix}{name}.")
    return out


def _shown(default: Any) -> str:
    if default is PydanticUndefined or default is dataclasses.MISSING:
        return "required"
    if isinstance(default, BaseModel):
        default = default.model_dump()
    if isinstance(default, list):
        default = [d.model_dump(exclude_defaults=True) if isinstance(d, BaseModel) else d for d in default]
    return yaml.safe_dump(default, default_flow_style=True, width=10_000).strip().removesuffix("...").strip()


def config_help() -> str:
    """One line per key: `dotted.key  (default)  description`, for an entrypoint's --help."""
    rows = [(doc.key, f"({_shown(doc.default)})", doc.description) for doc in documented_keys()]
    key_width = max(len(r[0]) for r in rows)
    default_width = min(24, max(len(r[1]) for r in rows))
    return "\n".join(f"  {k:<{key_width}}  {d:<{default_width}}  {text}" for k, d, text in rows)


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
    for key, instead in REMOVED_KEYS.items():
        *sections, last = key.split(".")
        node: Any = tree
        for part in sections:
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, dict) and last in node:
            raise ConfigError(f"'{key}' was removed: {instead}")
    try:
        return TandemConfig.model_validate(tree)
    except ValidationError as error:
        raise ConfigError(format_validation_error(error)) from None

"""The learner's config types (loss, optimizer, mesh, RL loop, gRPC service), light to import: no JAX.

launch.config builds the run's typed config, and derives the RL loop's and the service's, without
loading JAX; the learner's modules import them from here. Each field is documented where it is
declared (an attribute docstring or a pydantic description); launch's `--help` prints them.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from learner.guard import GuardConfig
from tandem_wire import WEIGHT_CHUNK_BYTES

Algorithm = Literal["grpo", "gspo", "gspo-token"]
Aggregation = Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "constant"]
DynamicSampling = Literal["off", "drop", "fill", "count"]
# models.attention.IMPLEMENTATIONS and models.tunix_families.REMAT_POLICIES (tests keep them equal)
AttentionImpl = Literal["auto", "xla", "blockwise", "pallas_gpu", "splash"]
RematPolicy = Literal["none", "full", "save_matmuls"]
REMAT_BOOL_WORDS = {"true": "full", "yes": "full", "on": "full", "false": "none", "no": "none", "off": "none"}

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
    advantage: str = "trajectory"
    """how a multi-turn trajectory's credit is spread over its turns: 'trajectory' (every turn gets the
    trajectory's GRPO advantage), 'reward_to_go' (a turn gets the rewards from it on), 'per_turn_grpo'
    (each turn's reward normalised against the same turn of the group's other trajectories; biased, see
    learner.algo.turn_advantages) or 'package.module:function'; only 'trajectory' goes with GSPO"""

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
        if self.advantage != "trajectory" and self.algorithm != "grpo":
            raise ValueError(f"advantage={self.advantage!r} gives each turn its own advantage, but "
                             f"{self.algorithm}'s sequence ratio takes one per sequence: use algorithm='grpo' "
                             "or advantage='trajectory'")
        if self.tis_cap is not None and self.tis_cap <= 0.0:
            raise ValueError(f"tis_cap must be positive or None, got {self.tis_cap}")


class OptimizerConfig(BaseModel):
    """AdamW + learning-rate schedule + clipping. `total_steps` is the schedule's horizon."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    learning_rate: float = Field(1e-4, gt=0, description="peak learning rate (after warmup)")
    schedule: Literal["cosine", "constant", "wsd"] = Field("cosine", description="after warmup: cosine decay "
                                                                            "over total_steps, constant, or "
                                                                            "wsd (constant, then a cosine "
                                                                            "decay over the last "
                                                                            "decay_fraction)")
    warmup_steps: int = Field(0, ge=0, description="linear warmup from 0 over this many updates")
    total_steps: int = Field(1000, ge=1, description="the schedule's horizon (default in a run: train.steps)")
    min_lr_ratio: float = Field(0.1, ge=0, le=1, description="cosine and wsd end at learning_rate * min_lr_ratio")
    decay_fraction: float = Field(0.25, gt=0, le=1, description="wsd: the share of total_steps its final "
                                                                "decay takes")
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


class DistributedConfig(BaseModel):
    """A learner spanning several processes (one per host) on JAX's distributed runtime.

    Unset fields come from the environment (JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES,
    JAX_PROCESS_ID); with none of the three set anywhere the learner is one process, unless `auto`
    asks `jax.distributed.initialize()` to detect its peers (Cloud TPU, SLURM, Open MPI, k8s)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    coordinator_address: str | None = Field(None, description="host:port of process 0's coordination "
                                                               "service (env JAX_COORDINATOR_ADDRESS)")
    num_processes: int | None = Field(None, ge=1, description="learner processes (env JAX_NUM_PROCESSES)")
    process_id: int | None = Field(None, ge=0, description="this process's index, 0 serves and publishes "
                                                           "(env JAX_PROCESS_ID)")
    auto: bool = Field(False, description="call jax.distributed.initialize() with no arguments (Cloud TPU "
                                          "pod slices and other platforms JAX detects)")
    initialization_timeout_s: int = Field(300, ge=1, description="how long to wait for every process to join")
    heartbeat_timeout_s: int = Field(100, ge=1, description="a process silent this long is declared dead "
                                                            "and every other process stops")


class Section(BaseModel):
    """A section of the run config: unknown keys fail, and so do bad values set after loading."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class TrainConfig(Section):
    """The learner's run: steps, batches, checkpoints, evaluation (the run config's `train` section).

    The RL loop reads it whole (RLLoopConfig.train), so an option of the loop is one field here
    plus its use there."""

    steps: int = Field(100, ge=1, description="optimizer steps")
    batch_size: int = Field(64, ge=1, description="packed rows per step (sft, pretrain)")
    prompts_per_step: int = Field(16, ge=1, description="groups per step (rl)")
    micro_batches: int = Field(1, ge=1, description="gradient accumulation: a step's batch in this many parts")
    num_iterations: int = Field(1, ge=1, description="rl: optimizer updates on each batch (μ of the GRPO paper; "
                                                     "TRL's and tunix's num_iterations, verl's ppo_epochs). "
                                                     "Above 1 each batch is reused, the clip bounding how far "
                                                     "the policy moves from the one that sampled it; weights "
                                                     "are published once per batch")
    checkpoint_every: int = Field(50, ge=1, description="save a checkpoint every this many steps")
    keep_checkpoints: int = Field(2, ge=1, description="checkpoints kept on disk")
    eval_every: int = Field(0, ge=0, description="rl: evaluate every this many steps; 0 = only at the end")
    eval_k: int = Field(8, ge=1, description="samples per prompt for pass@k")
    eval_temperature: float | None = Field(None, ge=0, description="temperature of the held-out samples "
                                                                   "(pass@k, the pass rate); default: "
                                                                   "rollout.temperature")
    eval_kv_cache_gib: float = Field(0.25, gt=0, description="KV cache of the evaluator's vLLM engine")
    logits_chunk_tokens: int = Field(2048, ge=1, description="tokens (rows × time steps) unembedded at once "
                                                             "by the learner: its logits memory is a few "
                                                             "copies of this × vocab in fp32, whatever the "
                                                             "batch")
    remat: RematPolicy = Field("save_matmuls", description="what the backward pass recomputes of each decoder "
                                                           "layer (MaxText's remat_policy): none (keep every "
                                                           "activation), full (keep the layer input, recompute "
                                                           "the layer: ~1/3 more compute), save_matmuls (keep the "
                                                           "weight matmuls' outputs, recompute norms, rope, "
                                                           "attention and activations; MaxText's 'minimal'). "
                                                           "true/false mean full/none. Costs: docs/benchmarks.md")
    attention: AttentionImpl = Field("auto", description="attention kernel (models.attention): auto picks "
                                                         "pallas_gpu on GPUs, splash on TPUs, blockwise "
                                                         "elsewhere; xla is the einsum reference, whose "
                                                         "memory grows with the square of the sequence")
    float32_logits: bool = Field(False, description="under mixed precision, unembed and log-softmax in "
                                                    "float32 (the float32 master head on the hidden states "
                                                    "cast to float32) instead of the compute dtype. Off: at "
                                                    "Qwen2.5-0.5B's shape it left behaviour_gap unchanged "
                                                    "(0.0704 both ways; docs/benchmarks.md)")
    skip_no_signal: bool = Field(True, description="rl: a step whose advantages are all zero makes no "
                                                   "optimizer update (AdamW's state untouched)")
    max_fill_batches: int = Field(4, ge=1, description="rl, algo.dynamic_sampling=fill: take at most this "
                                                       "many × prompts_per_step groups per step")
    guard: GuardConfig = Field(GuardConfig(), description="rl: entropy / update-norm jump guard")

    @field_validator("remat", mode="before")
    @classmethod
    def _remat_from_bool(cls, value: object) -> object:
        """The former boolean key keeps working: true = full, false = none (YAML 1.1's words too)."""
        if isinstance(value, str) and value.lower() in REMAT_BOOL_WORDS:
            return REMAT_BOOL_WORDS[value.lower()]
        return ("full" if value else "none") if isinstance(value, bool) else value


@dataclasses.dataclass(frozen=True)
class RLLoopConfig:
    """The fields without a default come from the run config (launch.config.TandemConfig.loop_config)."""

    train: TrainConfig
    """the run's `train` section: steps, prompts_per_step (P), max_fill_batches, guard, ..."""
    group_size: int
    """completions per group (G)"""
    max_sequence_len: int
    """prompt + completion tokens, the largest length bucket"""
    publish_every: int
    """publish new weights every this many steps"""
    batch_timeout_s: float = 900.0
    """give up when no group arrives for this long"""
    min_bucket_len: int = 16
    """the smallest length bucket"""


class ServerConfig(Section):
    """The learner's gRPC server (rl; the run config's `server` section). The service reads it whole
    (ServiceConfig.server), so an option of the server is one field here plus its use there."""

    host: str = Field("127.0.0.1", description="bind address; 0.0.0.0 serves actors on other nodes")
    port: int = Field(0, ge=0, le=65535, description="0 = any free port")
    auth_token: str | None = Field(None, description="shared token; defaults to $TANDEM_AUTH_TOKEN")
    open_enrollment: bool = Field(
        False, description="let any holder of the run token register any actor id, without the enrollment token "
                           "the run's fleet mints per actor: only for actors started outside Ray. Risk: one "
                           "token holder can then register ids by the thousand (up to max_actors) and claim "
                           "their share of stream slots and credits")
    tls_cert_path: str | None = Field(None, description="learner certificate: serve TLS only (with tls_key_path)")
    tls_key_path: str | None = Field(None, description="private key of tls_cert_path")
    tls_ca_path: str | None = Field(None, description="CA that signed tls_cert_path, handed to the rollout actors")
    weight_digest: Literal["blake3", "sha256"] = Field(
        "blake3", description="checksum of each weight version, named on the wire so actors verify with it: "
                              "blake3 (parallel, memory speed) or sha256 (FIPS; ~3x slower per push)")
    weight_shared_memory: bool = Field(
        True, description="also write each weight version once into /dev/shm; actors on the learner's host "
                          "copy it from there (one copy of egress per version however many read it) and "
                          "the rest stream it over gRPC")
    shared_weight_digest: Literal["xxh3_128", "blake3", "sha256"] = Field(
        "xxh3_128", description="digest a same-host actor verifies the shared-memory file with: xxh3_128 "
                                "(one core at memory speed) guards against a damaged file, and a forged one "
                                "would need a process that can write the actor's memory anyway; blake3 or "
                                "sha256 for operators who want a cryptographic hash on every path")
    weight_relay_fanout: int = Field(
        2, ge=0, description="actors off the learner's host that fetch a version relay its chunks to at most this "
                             "many others (learner/weights/relay.py), so the learner sends each version once; "
                             "0 = every such actor streams it from the learner")


class AdmissionSettings(BaseModel):
    """How the learner's service admits actors' work: the run config's `rollout.*` keys that the
    service reads, declared here once (launch.config.RolloutConfig extends this class with the actors'
    and the fleet's keys); the service reads them from the section whole (ServiceConfig.admission), so
    a new admission option is one field here plus its use."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_staleness: int = Field(1, ge=0, description="a group sampled more than this many weight versions "
                                                    "behind the newest is dropped as stale; and (η) actors may "
                                                    "hold at most (η + steps + 1) × train.prompts_per_step "
                                                    "prompts leased, queued or trained on")
    queue_capacity: int = Field(64, ge=1, description="scored groups the learner holds; when full, actors "
                                                      "are told to retry")
    lease_seconds: float = Field(60.0, gt=0, description="a leased prompt not answered within this is "
                                                         "offered again")
    late_group_wait_s: float = Field(0.0, ge=0, description="while groups leased η versions ago are still being "
                                                           "sampled by an actor that has not loaded newer weights, "
                                                           "a step holds its batch for them at most this long (its "
                                                           "version would leave them stale): for fleets with a "
                                                           "persistently slower actor; it idles the learner. 0 = "
                                                           "never hold (late groups are dropped when they come)")
    heartbeat_interval_s: float = Field(5.0, gt=0, description="how often actors report liveness")
    actor_timeout_s: float = Field(30.0, gt=0, description="an actor silent this long is replaced")


@dataclasses.dataclass(frozen=True)
class ServiceConfig:
    """How the learner's server validates, queues and serves (0 / None disables a limit).

    The fields without a default come from the run config: launch.config.TandemConfig.service_config
    derives them (its `rollout.*` and `server.*` keys document them); the rest are server limits."""

    server: ServerConfig
    """the run's `server` section: the run token (when set, every RPC needs `authorization: Bearer
    <token>`) and TLS (the server speaks TLS only when both tls_cert_path and tls_key_path are set)"""
    admission: AdmissionSettings
    """the run's `rollout` section, read for its admission keys: staleness, queue, leases, liveness"""
    prompts_per_step: int
    """groups a learner step trains on (B): with admission.max_staleness (η) it bounds the prompts in use to
    (η + steps + 1)·B (learner/service/lease_budget.py); 0 = no bound"""
    group_size: int
    """completions per group; 0 = any number >= 1"""
    max_prompt_tokens: int
    """longer prompts are refused; 0 = no limit"""
    vocab_size: int | None
    """when set, token ids must be in [0, vocab_size)"""
    max_sequence_tokens: int
    """a prompt with a longer completion (the learner's largest row) is refused; 0 = no limit"""
    max_group_bytes: int = 16 * 1024 * 1024
    """largest ScoredGroup message accepted"""
    weight_chunk_bytes: int = WEIGHT_CHUNK_BYTES
    """size of one FetchWeights chunk"""
    max_actors: int = 4096
    """registered actors kept; silent ones are evicted first"""
    max_streams: int = 256
    """concurrent group streams, all actors together (one per actor is normal)"""
    max_streams_per_actor: int = 2
    """room for a reconnect while the old stream is torn down"""
    max_weight_streams: int = 32
    """concurrent FetchWeights calls"""
    max_weight_streams_per_actor: int = 2
    """concurrent FetchWeights calls of one registered actor (its credential names it)"""
    max_anonymous_weight_streams: int = 4
    """concurrent FetchWeights calls without a valid credential, all such callers together"""
    unary_workers: int = 32
    """workers left for Register, Heartbeat, LeasePrompts, ReportWeights, Status"""
    unary_calls_per_actor: int = 8
    """concurrent unary calls naming one actor id (an honest actor makes at most ~4 at once)"""
    stream_idle_timeout_s: float = 600.0
    """a group stream that receives and sends nothing (or a weight stream not read) this long is
    cancelled; honest actors send at least once per generate call (rollout.generate_timeout_s)"""
    mode: str = "rl"
    """what Status reports the learner is running"""

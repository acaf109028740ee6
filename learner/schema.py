"""The learner's config types (loss, optimizer, mesh, RL loop, gRPC service), light to import: no JAX.

launch.config builds the run's typed config, and derives the RL loop's and the service's, without
loading JAX; the learner's modules import them from here. Each field is documented where it is
declared (an attribute docstring or a pydantic description); launch's `--help` prints them.
"""

from __future__ import annotations

import dataclasses
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from learner.guard import GuardConfig
from tandem_wire.weights.chunks import WEIGHT_CHUNK_BYTES

Aggregation = Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "constant"]
DynamicSampling = Literal["off", "drop", "fill", "count"]
# models.attention.IMPLEMENTATIONS and models.tunix_families.REMAT_POLICIES (tests keep them equal)
AttentionImpl = Literal["auto", "xla", "blockwise", "pallas_gpu", "splash"]
RematPolicy = Literal["auto", "none", "full", "save_matmuls"]
REMAT_BOOL_WORDS = {"true": "full", "yes": "full", "on": "full", "false": "none", "no": "none", "off": "none"}

AGGREGATIONS: tuple[str, ...] = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "constant")
DYNAMIC_SAMPLING: tuple[str, ...] = ("off", "drop", "fill", "count")


# Off-policy corrections (learner.algo.corrections): each reweights or masks the loss by the ratio
# ρ = π_old / π_behaviour of the learner's own pre-update policy to the one the actors sampled with
# (DeepSeek-V3.2's mask by the drift of π_θ from π_behaviour).


class TokenTIS(BaseModel):
    """Truncated importance sampling per token (Yao et al. 2025): w_t = min(ρ_t, cap)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    kind: Literal["token_tis"] = "token_tis"
    cap: float = Field(2.0, gt=0, description="C of w_t = min(ρ_t, C)")


class IcePop(BaseModel):
    """IcePop (Ring-1T, arXiv 2510.18855): w_t = M(ρ_t) = ρ_t inside [low, high], 0 outside; the defaults
    are the paper's run's α = 0.5, β = 5."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    kind: Literal["icepop"] = "icepop"
    low: float = Field(0.5, gt=0, description="α: tokens with ρ_t < low leave the loss")
    high: float = Field(5.0, gt=0, description="β: tokens with ρ_t > high leave the loss")


class TokenMask(BaseModel):
    """Token-level rejection (verl's term): a token whose ρ_t lies outside [low, high] leaves the loss, the
    others keep weight 1 (IcePop's band without its reweighting)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    kind: Literal["token_mask"] = "token_mask"
    low: float = Field(0.5, gt=0, description="tokens with ρ_t < low are masked")
    high: float = Field(2.0, gt=0, description="tokens with ρ_t > high are masked")


class GeometricSequenceMask(BaseModel):
    """Sequence mask on the geometric mean of its token ratios, exp(mean_t log ρ_t), outside [low, high]."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    kind: Literal["seq_mask_geo"] = "seq_mask_geo"
    low: float = Field(0.99, gt=0, description="sequences whose geometric-mean ratio is below this are masked")
    high: float = Field(1.01, gt=0, description="sequences whose geometric-mean ratio is above this are masked")


class SequenceTIS(BaseModel):
    """Truncated importance sampling per sequence: w_i = min(Π_t ρ_t, cap) on every token of sequence i."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    kind: Literal["seq_tis"] = "seq_tis"
    cap: float = Field(2.0, gt=0, description="C of w_i = min(Π_t ρ_it, C)")


class OffPolicySequenceMask(BaseModel):
    """DeepSeek-V3.2's off-policy sequence mask (arXiv 2512.02556): a sequence with negative advantage whose
    mean log(π_behaviour / π_θ) over its tokens (a KL estimate of the policy being trained from the one
    that sampled it) exceeds delta leaves the loss."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    kind: Literal["offpolicy_seq_mask"] = "offpolicy_seq_mask"
    delta: float = Field(0.05, ge=0, description="the KL above which a negative-advantage sequence is masked")


Correction = Annotated[TokenTIS | IcePop | TokenMask | GeometricSequenceMask | SequenceTIS | OffPolicySequenceMask,
                       Field(discriminator="kind")]


@dataclasses.dataclass(frozen=True)
class LossConfig:
    """What to optimise; defaults are DeepSeekMath GRPO with token-mean aggregation, no KL, no correction."""

    __pydantic_config__ = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    algorithm: str = "grpo"
    """the policy loss (learner.algo.policy_losses): 'grpo' (PPO's clipped token ratio), 'gspo' (sequence
    ratio), 'gspo-token', 'cispo' (MiniMax-M1: clipped, stop-gradient IS weight on every token's
    log-probability), 'decoupled_ppo' (AReaL: clip against the learner's own old policy, weighted by
    π_old / π_behaviour and masked above loss_kwargs.cap), a name registered with @policy_loss, or
    'package.module:function'"""
    loss_kwargs: dict[str, float | int | bool | str] = dataclasses.field(default_factory=dict)
    """keyword arguments of the policy loss (e.g. {cap: 5.0} for decoupled_ppo; a user's loss's own)"""
    epsilon_low: float = 0.2
    """clip range is [1 - epsilon_low, 1 + epsilon_high] (cispo: the bounds of its IS weight)"""
    epsilon_high: float = 0.2
    """upper clip; epsilon_high > epsilon_low is DAPO's clip-higher"""
    beta: float = 0.0
    """k3 KL coefficient to the reference policy; 0 means no reference model"""
    entropy_coef: float = 0.0
    """α of the entropy bonus: the loss less α times the policy's entropy over the completion tokens
    (aggregated as the policy loss), from the sampling distribution softmax(logits / T) in float32; with
    entropy_target set, the coefficient's starting value (learner.algo.entropy)"""
    entropy_target: float | None = None
    """entropy floor (Skywork-OR1's adaptive entropy control): after each update the coefficient rises by
    entropy_coef_step while the step's token-mean entropy is below this and falls by it (not below 0)
    while above, and the bonus applies only while the entropy is at most the target; None: a fixed
    entropy_coef"""
    entropy_coef_step: float = 0.005
    """Δ by which entropy_target moves the coefficient per update (Skywork-OR1's 0.005)"""
    aggregation: Aggregation = "token-mean"
    """'token-mean' (DAPO), 'seq-mean-token-mean' (GRPO and GSPO papers), 'seq-mean-token-sum', 'constant'
    (Dr.GRPO: sum of tokens / (N_seq * constant_normalizer))"""
    constant_normalizer: float | None = None
    """L for aggregation='constant' (e.g. the max completion length)"""
    estimator: str = "grpo"
    """the advantage estimator (learner.algo.advantages): 'grpo' (group mean and std), 'dr_grpo' (group
    mean only), 'rloo' (leave-one-out mean), 'reinforce_pp' (REINFORCE++-baseline: group mean, then the
    batch's std), a name registered with @estimator, or 'package.module:function'"""
    correction: Correction | None = None
    """off-policy correction by the ratio of the learner's own old policy to the actors' (learner.algo.
    corrections): {kind: token_tis, cap}, {kind: icepop, low, high}, {kind: token_mask, low, high},
    {kind: seq_mask_geo, low, high}, {kind: seq_tis, cap}, {kind: offpolicy_seq_mask, delta}; the
    reweighting ones (token_tis, icepop, seq_tis) move the clip to the learner's old policy, the masks
    keep it on the actors'; None: the clip is taken against the actors' policy and nothing is
    reweighted"""
    dynamic_sampling: DynamicSampling = "off"
    """groups whose rewards are all equal carry no signal: 'drop' removes them from the loss (and its
    denominators); 'fill' (DAPO) has the RL loop retire them and take more groups until the batch is
    full of groups with signal; 'count' keeps them and reports how many there were; 'off' keeps them"""
    advantage: str = "trajectory"
    """how a multi-turn trajectory's credit is spread over its turns: 'trajectory' (every turn gets the
    trajectory's advantage), 'reward_to_go' (a turn gets the rewards from it on), 'per_turn_grpo'
    (each turn's reward normalised against the same turn of the group's other trajectories; biased, see
    learner.algo.turn_advantages) or 'package.module:function'; only 'trajectory' goes with a loss whose
    ratio is per sequence (GSPO) and with an estimator without a group baseline (rloo)"""

    def __post_init__(self) -> None:
        # the registered names and what they declare: learner.algo.loss_rules.check_registered
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
        if self.entropy_coef < 0.0 or self.entropy_coef_step <= 0.0:
            raise ValueError(f"need entropy_coef >= 0 and entropy_coef_step > 0, got {self.entropy_coef}, "
                             f"{self.entropy_coef_step}")
        if self.entropy_target is not None and self.entropy_target <= 0.0:
            raise ValueError(f"entropy_target must be > 0 (or null), got {self.entropy_target}")
        if self.aggregation == "constant" and not (self.constant_normalizer and self.constant_normalizer > 0):
            raise ValueError("aggregation='constant' needs a positive constant_normalizer")
        if self.algorithm == "decoupled_ppo" and self.correction is not None:
            raise ValueError("decoupled_ppo carries its own correction (π_old / π_behaviour, masked above "
                             "loss_kwargs.cap): set algo.correction to null")
        band = self.correction
        if isinstance(band, IcePop | TokenMask | GeometricSequenceMask) and not band.low < band.high:
            raise ValueError(f"correction {band.kind}: need low < high, got {band.low}, {band.high}")


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


class HandoffRule(BaseModel):
    """Which evaluated step of a supervised stage the next stage (RL) starts from, chosen on held-out
    numbers rather than a step count: the last one whose greedy pass@1 is at most `max_greedy` (room
    for RL to improve) while its pass@k is at least `min_pass_at_k` (a right answer among the samples
    for RL to find)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_greedy: float = Field(ge=0, le=1, description="held-out greedy pass@1 at most this")
    min_pass_at_k: float = Field(ge=0, le=1, description="held-out pass@k (k = train.eval_k) at least this")

    def holds(self, scores: dict[str, float], k: int) -> bool:
        return scores["pass@1_greedy"] <= self.max_greedy and scores[f"pass@{k}"] >= self.min_pass_at_k


class StopRule(BaseModel):
    """Early stopping on a target (rl): end the run at the first evaluated step (every train.eval_every)
    whose held-out `metric` is at least `at_least`, instead of running out train.steps. The run ends
    as at its last step: checkpointed, exported, evaluated, and the summary says where and why."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    metric: Literal["pass@1_greedy", "pass@k"] = Field("pass@1_greedy", description="held-out greedy pass@1, "
                                                                                      "or pass@k (k = train.eval_k)")
    at_least: float = Field(ge=0, le=1, description="stop once the metric is at least this")

    def met(self, scores: dict[str, float], k: int) -> bool:
        return self.score(scores, k) >= self.at_least

    def score(self, scores: dict[str, float], k: int) -> float:
        """The rule's metric among an evaluation's `scores`."""
        return scores["pass@1_greedy" if self.metric == "pass@1_greedy" else f"pass@{k}"]


def plateaued(scores: list[float], patience: int) -> bool:
    """train.stop_at_plateau's rule: the last `patience` held-out scores (oldest first) have not raised the
    best one before them; False while there are no more than `patience` scores."""
    if len(scores) <= patience:
        return False
    return max(scores[-patience:]) <= max(scores[:-patience])


class TrainConfig(Section):
    """The learner's run: steps, batches, checkpoints, evaluation (the run config's `train` section).

    The RL loop reads it whole (RLLoopConfig.train), so an option of the loop is one field here
    plus its use there."""

    steps: int = Field(100, ge=1, description="optimizer steps")
    batch_size: int = Field(64, ge=1, description="packed rows per step (sft, pretrain)")
    prompts_per_step: int = Field(16, ge=1, description="groups per step (rl)")
    micro_batches: int = Field(1, ge=1, description="gradient accumulation: a step's batch in this many parts")
    row_tokens: int | None = Field(None, ge=1, description="rl: tokens of a packed row; every prompt + completion "
                                                           "is a segment of one (a row holds as many as fit); "
                                                           "None: the longest such sequence "
                                                           "(rollout.max_prompt_tokens + the completion's)")
    micro_batch_tokens: int | None = Field(None, ge=1, description="rl: tokens of a micro-batch (whole rows of "
                                                                   "row_tokens, at least one per data shard), so "
                                                                   "activation memory is bounded whatever a "
                                                                   "batch's tokens; None: micro_batches parts")
    num_iterations: int = Field(1, ge=1, description="rl: optimizer updates on each batch (μ of the GRPO paper; "
                                                     "TRL's and tunix's num_iterations, verl's ppo_epochs). "
                                                     "Above 1 each batch is reused, the clip bounding how far "
                                                     "the policy moves from the one that sampled it; weights "
                                                     "are published once per batch")
    checkpoint_every: int = Field(50, ge=1, description="save a checkpoint every this many steps")
    keep_checkpoints: int = Field(2, ge=1, description="checkpoints kept on disk")
    eval_every: int = Field(0, ge=0, description="evaluate on the held-out split every this many steps (rl, "
                                                 "sft, pretrain); 0 = only at the end")
    handoff: HandoffRule | None = Field(None, description="sft, pretrain: export hf_selected/ at the last step "
                                                           "evaluated (every eval_every) whose held-out scores "
                                                           "meet this rule, for the next stage to start from")
    stop_at: StopRule | None = Field(None, description="rl: end the run early at the first evaluated step "
                                                       "(every eval_every) whose held-out score meets this "
                                                       "target; None: run all train.steps")
    stop_at_plateau: int | None = Field(None, ge=1, description="rl: end the run early once this many "
                                                                "evaluations in a row (every eval_every) "
                                                                "have not raised the best held-out score "
                                                                "(train.stop_at's metric, else greedy "
                                                                "pass@1); None: no plateau rule")
    eval_k: int = Field(8, ge=1, description="samples per prompt for pass@k")
    eval_temperature: float | None = Field(None, ge=0, description="temperature of the held-out samples "
                                                                   "(pass@k, the pass rate); default: "
                                                                   "rollout.temperature")
    eval_kv_cache_gib: float = Field(0.25, gt=0, description="KV cache of the evaluator's vLLM engine")
    logits_chunk_tokens: int = Field(2048, ge=1, description="tokens (rows × time steps) unembedded at once "
                                                             "by the learner: its logits memory is a few "
                                                             "copies of this × vocab in fp32, whatever the "
                                                             "batch")
    remat: RematPolicy = Field("auto", description="what the backward pass recomputes of each decoder layer "
                                                   "(MaxText's remat_policy): none (keep every activation), full "
                                                   "(keep the layer input, recompute the layer: ~1/3 more "
                                                   "compute), save_matmuls (keep the weight matmuls' outputs, "
                                                   "recompute norms, rope, attention and activations; MaxText's "
                                                   "'minimal'), auto (per batch shape, the cheapest of none, "
                                                   "save_matmuls, full whose compiled step fits "
                                                   "train.memory_budget_gib by XLA's memory analysis; more "
                                                   "micro-batches when none fits). true/false mean full/none. "
                                                   "Costs: docs/benchmarks.md")
    memory_budget_gib: float | None = Field(None, gt=0, description="device memory a compiled step may use "
                                                                    "(per device), for remat auto and the "
                                                                    "micro-batch split; None: the device's "
                                                                    "memory less 2 % (on CPU, half the "
                                                                    "host's over the mesh's devices)")
    scan_layers: bool = Field(True, description="run the decoder layers under one jax.lax.scan (MaxText's "
                                                "scan_layers): one layer compiles whatever the depth; false "
                                                "unrolls them (debugging)")
    compile_ahead: Literal["all", "first"] = Field("all", description="rl row buckets compiled on a background "
                                                                       "thread while the actors sample "
                                                                       "(learner.compile_ahead): all (no step "
                                                                       "after the first waits for a compile) or "
                                                                       "first (the first batch's bucket only; "
                                                                       "others compile on first use: small runs "
                                                                       "on a busy CPU, where compiles take "
                                                                       "seconds)")
    attention: AttentionImpl = Field("auto", description="attention kernel (models.attention): auto picks "
                                                         "pallas_gpu on GPUs, blockwise elsewhere (TPUs "
                                                         "too: faster than splash on packed rows, measured); "
                                                         "xla is the einsum reference, whose "
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

    @model_validator(mode="after")
    def _handoff_needs_evaluations(self) -> TrainConfig:
        if self.handoff is not None and not self.eval_every:
            raise ValueError("train.handoff chooses among evaluated steps: set train.eval_every too")
        if self.stop_at is not None and not self.eval_every:
            raise ValueError("train.stop_at stops at an evaluated step: set train.eval_every too, or "
                             "train.stop_at=null to run every step")
        if self.stop_at_plateau is not None and not self.eval_every:
            raise ValueError("train.stop_at_plateau counts evaluations: set train.eval_every too, or "
                             "train.stop_at_plateau=null to run every step")
        return self

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
    """prompt + completion tokens at their longest: the longest sequence, and a packed row's tokens unless
    train.row_tokens says otherwise"""
    publish_every: int
    """publish new weights every this many steps"""
    loss: LossConfig
    """the run's `algo` section: the estimator and advantage rule the loop applies, and dynamic sampling"""
    batch_timeout_s: float = 900.0
    """give up when no group arrives for this long"""


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
    """workers left for the Register, Heartbeat, LeasePrompts and ReportWeights calls of verified actors"""
    unary_calls_per_actor: int = 8
    """concurrent unary calls of one verified actor id (an honest actor makes at most ~4 at once)"""
    unverified_unary_calls: int = 8
    """concurrent unary calls that prove no identity (no credential this learner minted for the id they
    name; on Register, no enrollment token for it either), all such callers together, on workers of
    their own: a first Register under open enrollment, or someone probing"""
    status_workers: int = 2
    """Status calls built at once, on workers of their own; more are answered at once with the newest built"""
    stream_idle_timeout_s: float = 600.0
    """a group stream that receives and sends nothing (or a weight stream not read) this long is
    cancelled; honest actors send at least once per generate call (rollout.generate_timeout_s)"""
    mode: str = "rl"
    """what Status reports the learner is running"""

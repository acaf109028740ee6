"""Jitted train steps for every mode over one `TrainState`: rl (GRPO / GSPO / GSPO-token), sft, pretrain.

Each step splits its global batch into micro-batches along the rows, sums the gradients of the
micro-batch losses with `lax.scan` (every micro-loss is already divided by the *global* batch's
normaliser, so the sum is the full-batch gradient; activations live for one micro-batch at a
time), then applies one optax update. Metrics are normalised the same way and summed too.

Compilation: each (kind, batch shape) compiles once. Its remat policy and micro-batch count come from a
`StepPlan` (learner.algo.step_plan: with remat "auto" the cheapest policy whose compiled step fits the
device, more micro-batches when none does), chosen when the shape is first met or compiled ahead
(`compile_rl_step`). The train state lives on fixed shardings (the params' fsdp/tp annotations, moments
alike, scalars replicated) that every step takes and returns, so no step compiles again for a layout change.
The jitted updates are named `train_step_<kind>` (learner.compile_log counts them).

Mixed precision: the state holds the master weights (and AdamW's moments) in their own dtype,
float32 by default; with a `compute_dtype` (bfloat16) every loss runs on a copy of the weights cast
to it inside the step, so activations and matmuls are bf16, while the gradient flows back through
the cast to the float32 master and the update is applied there. Updates far below a bf16 ulp of
their weight (lr 1e-6 on weights of ~0.02) therefore accumulate instead of being rounded away.
Exports (actors, HF dirs) are cast to the compute dtype.

LoRA (a model from models.lora.apply_lora): the state's params, their master dtype and AdamW's moments are
the adapters only. The base is frozen: cast once to the compute dtype at construction and passed to each
step beside the state (not donated, not differentiated, not in the optimizer or the checkpoint).
`hf_tensors` / `export_hf` give the merged weights W + (alpha/r)·B·A, `adapter_tensors` / `export_adapter`
the adapters in PEFT's names and layout.

- rl:       learner.algo.losses.rl_loss (a policy loss plug-in, an off-policy correction, an aggregation) on
            packed rows (several sequences a row, learner.algo.rl_batch), logprobs by chunked unembedding;
            optional frozen reference (the initial policy) when β > 0. A batch's first update returns its
            per-token logprobs: the pre-update policy π_old its later updates (train.num_iterations) take.
- sft:      masked cross-entropy on the batch's loss_mask (completion tokens only).
- pretrain: the same cross-entropy; its batches mark every token as a target.
Packed rows (every mode) attend only within their own sequence: the attention mask is causal AND
same-segment, and positions restart per sequence (learner.data, learner.algo.rl_batch).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from learner.algo import entropy as entropy_bonus
from learner.algo.logprobs import head_and_hidden, logprobs_from_hidden
from learner.algo.loss_rules import check_registered
from learner.algo.losses import LossConfig, Normalizer, normalizer_for, rl_loss
from learner.algo.optim import OptimizerConfig, make_optimizer, make_schedule
from learner.algo.policy_losses import resolve_policy_loss
from learner.algo.rl_batch import RLBatch, empty_rl_batch
from learner.algo.sequences import Sequences
from learner.algo.step_plan import PlanMemo, StepPlan, candidates, choose, memory_budget
from learner.algo.train_state import TrainState, init_train_state, state_shardings
from learner.data import TokenBatch
from learner.mesh import BATCH_AXIS, is_leader, row_sharding, shard_rows
from learner.metrics import Throughput, to_host
from models.attention import describe
from models.jax_model import (
    DTYPES,
    LoadedModel,
    export_adapter_tensors,
    export_hf_tensors,
    save_adapter_dir,
    save_hf_dir,
)
from models.peft import LoraConfig, adapter_config
from models.stacked_layers import per_layer, stacked_model

log = logging.getLogger(__name__)

Batch = dict[str, jax.Array]
SKIPPED: dict[str, float] = {"update_skipped": 1.0}  # the metrics of a step that made no update
# The frozen base of a LoRA model, (state,), or () when every weight trains: what nnx.merge takes after the
# trainable params.
Frozen = tuple[nnx.State, ...]
# (params, micro-batch, global normaliser, frozen reference params or None, frozen base) -> (loss, (metrics,
# per-token logprobs of the micro-batch's targets, or an empty array where the mode does not need them))
LossFn = Callable[[nnx.State, Batch, Normalizer, nnx.State | None, Frozen],
                  tuple[jax.Array, tuple[dict[str, jax.Array], jax.Array]]]
# Quantiles of the ratio ρ = π_old / π_behaviour over a batch's loss tokens, logged every rl step
RATIO_QUANTILES = (0.01, 0.1, 0.5, 0.9, 0.99)


def cast_floating(tree: nnx.State, dtype: jnp.dtype) -> nnx.State:
    """`tree` with its floating-point arrays cast to `dtype` (a no-op for arrays already in it)."""
    return jax.tree.map(lambda x: x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x, tree)


def packed_hidden(model: nnx.Module, input_ids: jax.Array, segment_ids: jax.Array,
                  positions: jax.Array) -> jax.Array:
    """Final-normed hidden states of packed rows: causal attention within each segment only."""
    return model.hidden_states(input_ids, positions, segment_ids)


@jax.jit
def ratio_quantiles(old: jax.Array, behaviour: jax.Array, mask: jax.Array) -> jax.Array:
    """RATIO_QUANTILES of ρ = exp(old − behaviour) over the tokens where mask > 0."""
    rho = jnp.where(mask > 0, jnp.exp(old - behaviour), jnp.nan)
    return jnp.nanquantile(rho, jnp.asarray(RATIO_QUANTILES))


class Trainer:
    """Owns the train state on a mesh and applies rl / sft / pretrain steps to it.

    `rl_step(batch)`, `sft_step(batch)` and `pretrain_step(batch)` take host (numpy) batches, run one
    optimizer update and return host metrics: loss, grad_norm (before clipping), learning_rate,
    tokens_per_s, step_time_s, update_norm (of the parameter change), plus the mode's own (rl:
    policy_loss, kl, entropy, the policy loss's (ratio, clip fractions), the off-policy picture
    (learner.algo.losses.correction_metrics, the effective sample size is_ess and quantiles of
    ρ = π_old/μ); sft/pretrain: entropy, loss_tokens).

    A batch with no learning signal is skipped: no optimizer update, AdamW's moments and step count
    untouched, and the metrics say `update_skipped: 1`. No signal means no loss token, or (rl, with
    `skip_no_signal`) every advantage zero, i.e. every group zero-signal. Stepping AdamW on such a
    batch is not a no-op: its second moment decays while the gradient is zero, so the next real
    gradient is divided by a shrunken √v and comes out sign-sized (up to 1/√(1−β2) ≈ 32× lr per
    coordinate, for ~1/(1−β1) steps of momentum), which is how sparse-reward runs collapse.

    Args:
      loaded, mesh: the policy, already placed on `mesh` (models.jax_model.load_model(..., mesh=mesh)); with
        LoRA (models.lora.apply_lora) only its adapters train.
      loss: RL loss settings. β > 0 keeps a frozen copy of `loaded`'s weights as the KL reference, so a
        resumed run must load the same initial model dir before restoring its checkpoint.
      micro_batches: gradient-accumulation factor; the batch's rows must divide by it. More are used for a
        shape whose step does not fit the memory budget otherwise (learner.algo.step_plan).
      micro_batch_tokens: rl: tokens of a micro-batch instead (whole rows, at least one per data shard;
        `rl_row_multiple` says how many rows), so an rl batch of any size runs in bounded memory.
      temperature: the actors' sampling temperature (behaviour logprobs are log_softmax(logits / T)).
      chunk_tokens: tokens (rows × time steps) unembedded at once when computing logprobs: the logits
        memory is a few copies of chunk_tokens × V fp32, whatever the batch (learner.algo.logprobs).
      compute_dtype: dtype the steps compute in ("bfloat16" or "float32"); None: the loaded params'.
        Exports default to it. The state's params keep the loaded dtype (the master weights).
      remat: remat policy per decoder layer (models.tunix_families.REMAT_POLICIES: none, full,
        save_matmuls), or "auto": per batch shape, the cheapest that fits `memory_budget_gib`.
      memory_budget_gib: device memory a step may use (learner.algo.step_plan.memory_budget: default the
        device's limit less step_plan.HEADROOM).
      scan_layers: run the decoder layers under one jax.lax.scan (compile time flat in depth); False unrolls
        them (models.tunix_families).
      attention: attention implementation (models.attention.IMPLEMENTATIONS; auto picks by backend).
      float32_logits: with a compute dtype, unembed and log-softmax in float32 on the float32 master
        head (the hidden states cast to float32), not in the compute dtype. The KL reference keeps the
        compute dtype. Not with LoRA, which keeps no float32 head.
      seed: the state's rng key.
      skip_no_signal: skip rl steps whose advantages are all zero (with β > 0 the KL term alone would
        still move the policy toward the reference; such steps are skipped too).
    """

    def __init__(self, loaded: LoadedModel, mesh: jax.sharding.Mesh, optimizer: OptimizerConfig, *,
                 loss: LossConfig | None = None, micro_batches: int = 1, micro_batch_tokens: int | None = None,
                 temperature: float = 1.0, chunk_tokens: int | None = 2048, compute_dtype: str | None = None,
                 remat: str = "none", attention: str = "auto", float32_logits: bool = False, seed: int = 0,
                 skip_no_signal: bool = True, memory_budget_gib: float | None = None, scan_layers: bool = True):
        if micro_batches < 1:
            raise ValueError(f"micro_batches must be >= 1, got {micro_batches}")
        self.loaded, self.mesh = loaded, mesh
        self.loss_config = loss or LossConfig()
        self.micro_batches, self.temperature, self.chunk_tokens = micro_batches, temperature, chunk_tokens
        self.micro_batch_tokens = micro_batch_tokens
        self.skip_no_signal = skip_no_signal
        self.compute_dtype = compute_dtype
        self.float32_logits = float32_logits and compute_dtype not in (None, "float32")
        if loaded.lora is not None and self.float32_logits:
            raise ValueError("train.float32_logits needs the float32 master head, which LoRA does not keep")
        self.remat, self._budget_gib = remat, memory_budget_gib
        # static attributes: part of the graph definition (the remat policy is set per step: _merge)
        loaded.model.attention_impl, loaded.model.scan_layers = attention, scan_layers
        # under a scan the trained copy stores its layers stacked (models.stacked_layers), and `loaded.model`
        # keeps tunix's per-layer tree, its layer arrays freed, for exports to refill (_bound)
        self._num_layers = len(loaded.model.layers) if scan_layers else 0
        self._model = stacked_model(loaded.model) if scan_layers else loaded.model
        log.info("%s; remat %s; layers %s; logits in %s", describe(attention), remat,
                 "scanned" if scan_layers else "unrolled",
                 "float32" if self.float32_logits else compute_dtype or "the params' dtype")
        self._graphdef, params, self._frozen, self._rest = self._split()
        self._tx = make_optimizer(optimizer)
        self._schedule = make_schedule(optimizer)
        with jax.set_mesh(mesh):
            self.state = init_train_state(params, self._tx, mesh=mesh, seed=seed)
            self._state_shardings = state_shardings(self.state)
            # The frozen reference policy is the initial one, kept in the compute dtype it runs in
            # (a copy: steps donate the state).
            self._reference = None
            if self.loss_config.beta > 0:
                self._reference = jax.tree.map(jnp.copy, params)
                if compute_dtype is not None:
                    self._reference = cast_floating(self._reference, DTYPES[compute_dtype])
        check_registered(self.loss_config)
        self._policy_loss = resolve_policy_loss(self.loss_config)
        self._steps: dict[tuple[str, str, int], Callable] = {}  # (kind, remat, micro-batches) -> jitted update
        self.plans: dict[tuple[str, int, int], StepPlan] = {}  # (kind, rows, length) -> how it compiled
        self._plan_locks: dict[tuple[str, int, int], threading.Lock] = {}
        self._plan_locks_lock = threading.Lock()
        self.last_logps: jax.Array | None = None  # the last rl update's pre-update logprobs [B, T − 1]
        self.entropy_control = entropy_bonus.EntropyControl(self.loss_config)  # α of the entropy bonus

    def _split(self) -> tuple[nnx.GraphDef, nnx.State, Frozen, nnx.State]:
        """Graph definition, trainable params, frozen base and the rest of the model. With LoRA the base is
        cast to the compute dtype here, once, and the model keeps only that copy."""
        if self.loaded.lora is None:
            graphdef, params, rest = nnx.split(self._model, nnx.Param, ...)
            return graphdef, params, (), rest
        graphdef, adapters, base, rest = nnx.split(self._model, nnx.LoRAParam, nnx.Param, ...)
        if self.compute_dtype is not None:
            with jax.set_mesh(self.mesh):
                base = jax.jit(functools.partial(cast_floating, dtype=DTYPES[self.compute_dtype]))(base)
            nnx.update(self._model, base)
        return graphdef, adapters, (base,), rest

    # -- public steps --------------------------------------------------------------------------

    def rl_step(self, batch: RLBatch, old_logps: jax.Array | None = None) -> dict[str, float]:
        """One update on an assembled RL batch; merge in the batch's statistics for logging.

        `old_logps`: the pre-update policy's logprobs of this batch (`last_logps` after its first update),
        for a batch's later updates (train.num_iterations > 1); None on its first, where the current
        policy is the pre-update one. After the update `last_logps` holds this update's pre-update
        logprobs (device array, [B, T − 1])."""
        if self.skip_no_signal and not (batch.advantages * batch.completion_mask).any():
            return dict(SKIPPED)
        arrays = batch._asdict()
        if old_logps is not None:
            arrays["old_logps"] = old_logps
        coef = self.entropy_control.coef
        metrics = self._run("rl" if old_logps is None else "rl_again", arrays, batch.completion_mask, coef)
        if not metrics.get("update_skipped"):
            self.entropy_control.observe(metrics["entropy"])
            metrics["entropy_coef"] = coef
        if "is_ratio_mean" in metrics:  # effective sample size of ρ = π_old/μ: (Σρ)² / (N Σρ²)
            metrics["is_ess"] = metrics["is_ratio_mean"] ** 2 / max(metrics["is_ratio_sq_mean"], 1e-30)
        if old_logps is None and not metrics.get("update_skipped"):
            with jax.set_mesh(self.mesh):
                quantiles = self._ratio_quantiles(self.last_logps, batch)
            metrics.update({f"is_ratio_p{round(q * 100):02d}": v for q, v in zip(RATIO_QUANTILES, quantiles,
                                                                                  strict=True)})
        return metrics

    def _ratio_quantiles(self, old_logps: jax.Array, batch: RLBatch) -> list[float]:
        """Quantiles of ρ = π_old/μ over the batch's loss tokens (the whole global batch: not a sum over
        micro-batches, so computed apart from the step)."""
        arrays = shard_rows(self.mesh, {"behaviour": batch.behaviour_logps[:, 1:],
                                        "mask": batch.completion_mask[:, 1:]})
        return [float(q) for q in np.asarray(ratio_quantiles(old_logps, arrays["behaviour"], arrays["mask"]))]

    def compile_rl_step(self, rows: int, length: int, *, again: bool = False) -> StepPlan:
        """Plan and compile the rl step for batches of `rows` × `length` now, so that the first such step
        starts at once (the RL loop does this for every row bucket while the actors sample). `again`: the
        later updates' step too (train.num_iterations > 1). Thread-safe: it reads only the state's shapes and
        shardings, and a shape being compiled here is waited for, not compiled twice, by a step that needs it."""
        with jax.set_mesh(self.mesh):
            batch = self._abstract_batch(empty_rl_batch(rows, length)._asdict())
            plan = self._plan("rl", batch)
            token = jax.ShapeDtypeStruct((rows, length - 1), jnp.float32, sharding=row_sharding(self.mesh))
            if again:
                self._plan("rl_again", {**batch, "old_logps": token})
            ratio_quantiles.lower(token, token, token).compile()
        return plan

    def sft_step(self, batch: TokenBatch) -> dict[str, float]:
        return self._run("ce", batch._asdict(), batch.loss_mask)

    pretrain_step = sft_step  # same loss; a pretrain batch's loss_mask covers every token

    def compiled_memory(self, kind: str, arrays: Mapping[str, np.ndarray]) -> jax.stages.CompiledMemoryStats:
        """XLA's memory analysis of the compiled `kind` step ("rl" or "ce") on host `arrays` (compiled, not run),
        under the plan the trainer takes for that shape."""
        with jax.set_mesh(self.mesh):
            batch = self._abstract_batch(arrays)
            plan = self._plan(kind, batch)
            return self._lowered(kind, plan, batch).compile().memory_analysis()

    @property
    def lora(self) -> LoraConfig | None:
        """The LoRA being trained, None when every weight trains."""
        return self.loaded.lora

    @property
    def model(self) -> nnx.Module:
        """The model with the current parameters (re-bound each time: steps donate the old buffers)."""
        return self._bound().model

    def hf_tensors(self, dtype: str | None = None) -> Iterator[tuple[str, np.ndarray]]:
        """Current weights as HF-named host tensors (for publishing to the actors, the evaluator), in `dtype`
        (default: the compute dtype); with LoRA the merged weights W + (alpha/r)·B·A."""
        with self._exported() as loaded:
            yield from export_hf_tensors(loaded, dtype or self.compute_dtype)

    def export_hf(self, out_dir: Path, *, tokenizer_dir: Path, dtype: str | None = None) -> Path:
        """Write the current weights as a HF model dir (vLLM / transformers load it; merged with LoRA).
        Multi-host: every process calls it (the tensors are gathered), process 0 writes."""
        if not is_leader():
            deque(self.hf_tensors(dtype), maxlen=0)
            return Path(out_dir)
        with self._exported() as loaded:
            return save_hf_dir(loaded, out_dir, tokenizer_dir=tokenizer_dir, dtype=dtype or self.compute_dtype)

    def adapter_tensors(self, dtype: str | None = None) -> Iterator[tuple[str, np.ndarray]]:
        """LoRA: the current adapters as PEFT-named host tensors (models.peft.adapter_shapes: A [r, in],
        B [out, r]) in `dtype` (default: the compute dtype), for publishing adapter versions."""
        with self._exported() as loaded:
            yield from export_adapter_tensors(loaded, dtype or self.compute_dtype)

    def adapter_config(self) -> dict[str, Any]:
        """LoRA: the adapters' adapter_config.json (models.peft.adapter_config over the loaded dir)."""
        return adapter_config(self.lora, str(self.loaded.hf_dir or ""))

    def export_adapter(self, out_dir: Path, *, dtype: str | None = None) -> Path:
        """LoRA: write the current adapters as a PEFT dir (adapter_config.json naming the loaded dir as the
        base, adapter_model.safetensors) that peft + transformers and vLLM load. Multi-host as export_hf."""
        if not is_leader():
            deque(self.adapter_tensors(dtype), maxlen=0)
            return Path(out_dir)
        with self._exported() as loaded:
            return save_adapter_dir(loaded, out_dir, dtype=dtype or self.compute_dtype)

    # -- machinery -----------------------------------------------------------------------------

    def _bound(self) -> LoadedModel:
        """The loaded model (tunix's per-layer tree) on the current parameters and frozen base. With stacked
        layers its layers are slices of the stored ones: a copy on the devices while the model holds them
        (`model`, for tests and tools; the exports free it: _exported)."""
        return self._bind()[0]

    def _bind(self) -> tuple[LoadedModel, list[jax.Array]]:
        """_bound, and the arrays it made (the per-layer slices)."""
        stored = (self.state.params, *self._frozen)
        states = tuple(per_layer(state, self._num_layers) for state in stored) if self._num_layers else stored
        for state in states:
            nnx.update(self.loaded.model, state)
        kept = {id(x) for x in jax.tree.leaves(stored)}
        return self.loaded, [x for x in jax.tree.leaves(states) if id(x) not in kept]

    @contextlib.contextmanager
    def _exported(self) -> Iterator[LoadedModel]:
        """_bound for one export, the per-layer copy freed after it (a step at the edge of the device's memory
        must not find it still held)."""
        loaded, made = self._bind()
        try:
            yield loaded
        finally:
            for x in made:
                x.delete()

    def rl_row_multiple(self, row_tokens: int) -> int:
        """Rows of an rl batch of `row_tokens`-token rows come in multiples of this: one micro-batch's rows
        (micro_batch_tokens, whole rows, a multiple of the data shards) or micro_batches × data shards."""
        shards = self.mesh.shape[BATCH_AXIS]
        if self.micro_batch_tokens:
            return max(1, self.micro_batch_tokens // (row_tokens * shards)) * shards
        return self.micro_batches * shards

    def _parts(self, kind: str, rows: int, length: int) -> int:
        """The micro-batches a batch of `rows` × `length` splits into."""
        if kind == "ce" or not self.micro_batch_tokens:
            parts = self.micro_batches
        else:
            parts = rows // self.rl_row_multiple(length)
        if not parts or rows % parts:
            raise ValueError(f"batch of {rows} rows does not split into {parts or self.micro_batches} micro-batches")
        return parts

    def _run(self, kind: str, arrays: Mapping[str, np.ndarray | jax.Array], loss_mask: np.ndarray,
             entropy_coef: float = 0.0) -> dict[str, float]:
        self._parts(kind, *loss_mask.shape)
        if not loss_mask.any():
            return dict(SKIPPED)
        with Throughput() as meter, jax.set_mesh(self.mesh):
            batch = shard_rows(self.mesh, {k: v for k, v in arrays.items() if isinstance(v, np.ndarray)})
            batch.update({k: v for k, v in arrays.items() if not isinstance(v, np.ndarray)})  # already placed
            plan = self._plan(kind, batch)
            self.state, metrics, logps = self._step(kind, plan)(self.state, batch, self._reference, self._frozen,
                                                                np.float32(entropy_coef))
            if kind.startswith("rl"):
                self.last_logps = logps
            metrics = to_host(metrics)
        return {**metrics, **meter.metrics(int(arrays["attention_mask"].sum()))}

    def _step(self, kind: str, plan: StepPlan) -> Callable:
        """The jitted update of `kind` under `plan`'s remat and micro-batches (jax caches its compilations per
        batch shape): "rl" (a batch's first update), "rl_again" (a later one: π_old given) or "ce" (sft,
        pretrain). Named train_step_<kind> for learner.compile_log."""
        key = (kind, plan.remat, plan.parts)
        if key not in self._steps:
            loss_fn = self._ce_loss if kind == "ce" else functools.partial(self._rl_loss, given_old=kind == "rl_again")
            update = functools.partial(self._update, loss_fn=functools.partial(loss_fn, remat=plan.remat), kind=kind,
                                       parts=plan.parts)

            def step(state: TrainState, batch: Batch, reference: nnx.State | None, frozen: Frozen,
                     entropy_coef: jax.Array):
                return update(state, batch, reference, frozen, entropy_coef)

            step.__name__ = step.__qualname__ = f"train_step_{kind}"
            self._steps[key] = jax.jit(step, donate_argnums=0)
        return self._steps[key]

    def _lowered(self, kind: str, plan: StepPlan, batch: Batch) -> jax.stages.Lowered:
        return self._step(kind, plan).lower(self.state, batch, self._reference, self._frozen, np.float32(0.0))

    def _abstract_batch(self, arrays: Mapping[str, np.ndarray | jax.Array]) -> Batch:
        """Shapes, dtypes and row shardings of a batch, for compiling without placing it."""
        sharding = row_sharding(self.mesh)
        return {k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=sharding) for k, v in arrays.items()}

    def _plan(self, kind: str, batch: Batch) -> StepPlan:
        """The plan of `kind` steps on batches shaped like `batch`, compiled on first need (one thread compiles
        a shape; another needing it waits): the configured remat and micro-batches, or (learner.algo.
        step_plan) the cheapest that fit the memory budget."""
        rows, length = batch["input_ids"].shape
        key = (kind, rows, length)
        with self._plan_locks_lock:
            lock = self._plan_locks.setdefault(key, threading.Lock())
        with lock:
            if key not in self.plans:
                parts, budget = self._parts(kind, rows, length), memory_budget(self._budget_gib, self.mesh)
                memo = PlanMemo.for_jax_cache()
                fingerprint = memo.fingerprint(
                    kind, rows, length, self.remat, parts, budget, self.mesh.devices.shape,
                    jax.devices()[0].device_kind, jax.__version__, self.loaded.hf_config, self.compute_dtype,
                    self.chunk_tokens, self.loss_config, self.lora, self.loaded.model.attention_impl,
                    self.loaded.model.scan_layers, self.float32_logits)
                self.plans[key] = choose(lambda remat, parts: self._lowered(kind, StepPlan(remat, parts, 0),
                                                                            batch).compile(),
                                         candidates(self.remat, parts, rows, self.mesh.shape[BATCH_AXIS]), budget,
                                         what=f"{kind} step {rows} x {length}", remembered=memo.get(fingerprint))
                memo.put(fingerprint, self.plans[key])
            return self.plans[key]

    def _normalizer(self, batch: Batch, kind: str) -> Normalizer:
        mask = batch["loss_mask" if kind == "ce" else "completion_mask"][:, 1:]
        return normalizer_for(mask, Sequences.of(batch["segment_ids"][:, 1:]))

    def _update(self, state: TrainState, batch: Batch, reference: nnx.State | None, frozen: Frozen,
                entropy_coef: jax.Array, *,
                loss_fn: LossFn, kind: str, parts: int) -> tuple[TrainState, dict[str, jax.Array], jax.Array]:
        norm = self._normalizer(batch, kind)
        k = parts
        # Micro-batch j takes rows j, j+k, j+2k, ...: each keeps rows spread over all fsdp shards.
        micro = jax.tree.map(lambda x: x.reshape(x.shape[0] // k, k, *x.shape[1:]).swapaxes(0, 1), batch)
        grad_fn = jax.value_and_grad(loss_fn, has_aux=True)

        def accumulate(grads, mb):
            (loss, (metrics, logps)), mb_grads = grad_fn(state.params, mb, norm, reference, frozen, entropy_coef)
            return jax.tree.map(jnp.add, grads, mb_grads), (loss, metrics, logps)

        # Only the gradients ride in the carry (their shapes are the parameters'): the loss and metrics come out
        # per micro-batch and are summed after, so the loss is traced once (a carry of its outputs would need
        # their shapes first, i.e. a second trace of the whole forward and backward).
        grads, (losses, metrics, logps) = jax.lax.scan(accumulate, jax.tree.map(jnp.zeros_like, state.params), micro)
        loss, metrics = losses.sum(0), jax.tree.map(lambda m: m.sum(0), metrics)
        logps = logps.swapaxes(0, 1).reshape(batch["input_ids"].shape[0], *logps.shape[2:])  # the batch's row order
        logps = jax.lax.with_sharding_constraint(logps, row_sharding(self.mesh))  # as a later update takes it
        updates, opt_state = self._tx.update(grads, state.opt_state, state.params)
        metrics = {"loss": loss, **metrics, "grad_norm": optax.tree.norm(grads),
                   "update_norm": optax.tree.norm(updates), "learning_rate": self._schedule(state.step),
                   "update_skipped": jnp.zeros(())}
        new_state = TrainState(params=optax.apply_updates(state.params, updates), opt_state=opt_state,
                               step=state.step + 1, rng=state.rng)
        # the state leaves on the shardings it came in on, so the next step finds the layout it compiled for
        return jax.lax.with_sharding_constraint(new_state, self._state_shardings), metrics, logps

    def _merge(self, params: nnx.State, frozen: Frozen, remat: str = "none") -> nnx.Module:
        """The model on `params` cast to the compute dtype (the gradient flows back through the cast) and the
        frozen base, if any, its layers under the `remat` policy."""
        if self.compute_dtype is not None:
            params = cast_floating(params, DTYPES[self.compute_dtype])
        model = nnx.merge(self._graphdef, params, *frozen, self._rest)
        model.remat_policy = remat
        return model

    def _float32_head(self, params: nnx.State) -> nnx.Module | None:
        """The model on the float32 master `params`, whose head unembeds under float32_logits; else None."""
        return nnx.merge(self._graphdef, params, self._rest) if self.float32_logits else None

    def _rl_loss(self, params: nnx.State, mb: Batch, norm: Normalizer, reference: nnx.State | None,
                 frozen: Frozen, entropy_coef: jax.Array, *, given_old: bool, remat: str = "none"):
        def logprobs(p: nnx.State, head: nnx.Module | None) -> tuple[jax.Array, jax.Array]:
            model = self._merge(p, frozen, remat)
            hidden = packed_hidden(model, mb["input_ids"], mb["segment_ids"], mb["positions"])[:, :-1]
            head, hidden = head_and_hidden(model, hidden, head)
            return logprobs_from_hidden(head, hidden, mb["input_ids"][:, 1:], temperature=self.temperature,
                                        chunk_tokens=self.chunk_tokens)

        logps, entropy = logprobs(params, self._float32_head(params))
        ref = None
        if reference is not None:
            ref = jax.lax.stop_gradient(logprobs(reference, None)[0])
        loss, metrics = rl_loss(logps, mb["behaviour_logps"][:, 1:], mb["advantages"][:, 1:],
                                mb["completion_mask"][:, 1:], Sequences.of(mb["segment_ids"][:, 1:]),
                                self.loss_config, norm, self._policy_loss,
                                old_logps=mb["old_logps"] if given_old else None, ref_logps=ref, entropy=entropy,
                                entropy_coef=entropy_coef if entropy_bonus.enabled(self.loss_config) else 0.0)
        return loss, (metrics, jax.lax.stop_gradient(logps))

    def _ce_loss(self, params: nnx.State, mb: Batch, norm: Normalizer, reference: nnx.State | None,
                 frozen: Frozen, entropy_coef: jax.Array, *, remat: str = "none"):
        del reference, entropy_coef  # no KL term or entropy bonus in sft / pretrain
        loss, metrics = masked_cross_entropy(self._merge(params, frozen, remat), mb, mb["input_ids"][:, 1:], norm,
                                             self.chunk_tokens, float32_head=self._float32_head(params))
        return loss, (metrics, jnp.zeros((mb["input_ids"].shape[0], 0), jnp.float32))


def masked_cross_entropy(model: nnx.Module, batch: Batch, targets: jax.Array, norm: Normalizer,
                         chunk_tokens: int | None, *, float32_head: nnx.Module | None = None,
                         ) -> tuple[jax.Array, dict[str, jax.Array]]:
    """L = −Σ_t m_t log p(y_t | x_≤t of its segment) / N_tok, with N_tok taken over the global batch.

    `targets` [B, T−1] are the next tokens (input_ids[:, 1:]); m = batch["loss_mask"][:, 1:], so a
    target the mask leaves out (a prompt token in SFT) has no effect on the loss or its gradient.
    """
    hidden = packed_hidden(model, batch["input_ids"], batch["segment_ids"], batch["positions"])[:, :-1]
    head, hidden = head_and_hidden(model, hidden, float32_head)
    logps, entropy = logprobs_from_hidden(head, hidden, targets, chunk_tokens=chunk_tokens)
    mask = batch["loss_mask"][:, 1:]
    denominator = jnp.maximum(norm.num_tokens, 1.0)
    loss = -(logps * mask).sum() / denominator
    entropy = jax.lax.stop_gradient((entropy * mask).sum() / denominator)
    return loss, {"entropy": entropy, "loss_tokens": mask.sum()}

"""tunix's Flax NNX model families, completed where google-tunix 0.1.5 falls short of HF.

The classes subclass tunix's and change only what is needed for HF-exact numerics and sharding:
- every family gains `hidden_states` (final-normed, before the output projection) and `unembed`,
  so logprobs can be computed in chunks without materialising [B, T, V] logits;
- `hidden_states` runs its own decoder-layer forward on tunix's submodules (norms, q/k/v/o
  projections, MLP), taking segment ids instead of a dense [B, T, T] mask, with the attention
  implementation of `models.attention` (linear memory in T) and a remat policy per layer, both chosen
  by the trainer; tunix's own `__call__` (its einsum attention) is left as it is;
- Llama3 and Qwen3 attention call tunix's `apply_rope` without the config's theta (it always uses
  1e6) and know no rope scaling: here the rope frequencies come from the HF config (theta, Llama 3
  scaling) for the duration of each forward pass (see `_config_rope`);
- tunix's Qwen3 has no tied embeddings: a tied Qwen3 shares the embedder as its output head;
- the configs built by `tunix_config` correct the q/k/v kernels' sharding annotation (`_sharding`).
The parameter tree (names and shapes) is tunix's, so tunix's loaders, losses and samplers work on
these models unchanged.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import math
from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from tunix.models.llama3 import model as llama3_lib
from tunix.models.llama3 import params as llama3_params
from tunix.models.qwen2 import model as qwen2_lib
from tunix.models.qwen2 import params as qwen2_params
from tunix.models.qwen3 import model as qwen3_lib
from tunix.models.qwen3 import params as qwen3_params

from models.attention import attention
from models.families import check_supported, family_of, head_dim_of, is_tied, kv_heads_of, rope_settings
from models.stacked_layers import StackedLayers

# ---------------------------------------------------------------------------------------------
# Rope from the HF config (Llama3 / Qwen3)


def rope_inv_freq(hf_config: dict[str, Any]) -> tuple[float, ...]:
    """Rope inverse frequencies [head_dim // 2] exactly as transformers computes them (float32).

    Default rope: 1 / theta^(2i/d). "llama3" scaling (Llama 3.1+): long wavelengths divided by
    `factor`, short ones kept, a smooth blend between (transformers' `_compute_llama3_parameters`).
    """
    theta, scaling = rope_settings(hf_config)
    dim = head_dim_of(hf_config)
    inv_freq = (1.0 / (theta ** (np.arange(0, dim, 2, dtype=np.int64).astype(np.float32) / dim)))
    inv_freq = inv_freq.astype(np.float32)
    if scaling is not None and scaling["rope_type"] == "llama3":
        factor = scaling["factor"]
        low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
        old_len = scaling["original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv_freq
        scaled = np.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
        smooth = (old_len / wavelen - low) / (high - low)
        blended = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wavelen >= old_len / high) & (wavelen <= old_len / low)
        inv_freq = np.where(medium, blended, scaled).astype(np.float32)
    return tuple(float(x) for x in inv_freq)


_ROPE_INV_FREQ: contextvars.ContextVar[tuple[float, ...] | None] = contextvars.ContextVar(
    "tandem_rope_inv_freq", default=None)


@contextlib.contextmanager
def _config_rope(inv_freq: tuple[float, ...]) -> Iterator[None]:
    """Within this block (i.e. while a forward pass is traced) rope uses `inv_freq`."""
    token = _ROPE_INV_FREQ.set(inv_freq)
    try:
        yield
    finally:
        _ROPE_INV_FREQ.reset(token)


def config_rope_tables(positions: jax.Array, inv_freq: tuple[float, ...]) -> tuple[jax.Array, jax.Array]:
    """sin, cos [B, T, head_dim/2] float32 of positions × the config's inverse frequencies."""
    angles = positions[..., None].astype(jnp.float32) * jnp.asarray(inv_freq, jnp.float32)
    return jnp.sin(angles), jnp.cos(angles)


def rotate(x: jax.Array, sin: jax.Array, cos: jax.Array) -> jax.Array:
    """Rope on x [B, T, heads, head_dim] with sin, cos [B, T, head_dim/2] already in x's dtype (the
    half-split rotation of tunix's and transformers' Qwen/Llama)."""
    first, second = jnp.split(x, 2, axis=-1)
    sin, cos = sin[:, :, None, :], cos[:, :, None, :]
    return jnp.concatenate([first * cos - second * sin, second * cos + first * sin], axis=-1)


def _rope_honouring_config(tunix_apply_rope: Callable) -> Callable:
    """Wrap tunix's module-level `apply_rope` (same signature) to use the active config frequencies.

    tunix 0.1.5's Llama3/Qwen3 attention calls `apply_rope(x, positions, head_dim=...)` and so always
    rotates with theta = 1e6. Patching the module global is the only hook short of copying the
    attention block; outside `_config_rope` the original function runs, so stock tunix models
    behave as before.
    """

    def apply_rope(inputs: jax.Array, positions: jax.Array, head_dim: int,
                   rope_theta: float = 1_000_000) -> jax.Array:
        inv_freq = _ROPE_INV_FREQ.get()
        if inv_freq is None:
            return tunix_apply_rope(inputs, positions, head_dim, rope_theta)
        sin, cos = config_rope_tables(positions, inv_freq)
        return rotate(inputs, sin.astype(inputs.dtype), cos.astype(inputs.dtype))  # cast as transformers does

    apply_rope.tandem_wrapped = tunix_apply_rope  # marks the patch as installed
    return apply_rope


for _lib in (llama3_lib, qwen3_lib):
    if not hasattr(_lib.apply_rope, "tandem_wrapped"):
        _lib.apply_rope = _rope_honouring_config(_lib.apply_rope)


# ---------------------------------------------------------------------------------------------
# Configs


@dataclasses.dataclass(slots=True)
class Qwen3Config(qwen3_lib.ModelConfig):
    """tunix's Qwen3 config plus what the HF config carries and tunix 0.1.5 ignores."""

    use_tied_embedding: bool = False
    rope_inv_freq: tuple[float, ...] = ()


@dataclasses.dataclass(frozen=True)
class Llama3Config(llama3_lib.ModelConfig):
    """tunix's Llama3 config plus the rope frequencies (theta and scaling) from the HF config."""

    rope_inv_freq: tuple[float, ...] = ()


def _sharding(lib: Any) -> Any:
    """tunix's default sharding with q/k/v kernels fixed: tunix annotates them as if laid out
    [heads, embed, head_dim] (heads over tp, embed over fsdp), but stores them [embed, heads, head_dim],
    so the stock annotation splits heads over fsdp (fsdp could not exceed num_kv_heads) and embed
    over tp. Here: embed over fsdp, heads over tp, like o_proj and the MLP."""
    default = lib.ShardingConfig.get_default_sharding()
    return dataclasses.replace(default, q_weight_ndh=("fsdp", "tp", None), kv_weight_ndh=("fsdp", "tp", None))


def tunix_config(hf_config: dict[str, Any]) -> Any:
    """The tunix ModelConfig of the family, built from a HF config.json dict."""
    check_supported(hf_config)
    family = family_of(hf_config)
    theta, _ = rope_settings(hf_config)
    common = dict(
        num_layers=hf_config["num_hidden_layers"],
        vocab_size=hf_config["vocab_size"],
        embed_dim=hf_config["hidden_size"],
        hidden_dim=hf_config["intermediate_size"],
        num_heads=hf_config["num_attention_heads"],
        head_dim=head_dim_of(hf_config),
        num_kv_heads=kv_heads_of(hf_config),
        rope_theta=theta,
        norm_eps=float(hf_config.get("rms_norm_eps", 1e-6)),
    )
    lib = {"qwen2": qwen2_lib, "qwen3": qwen3_lib, "llama3": llama3_lib}[family]
    common["shd_config"] = _sharding(lib)
    if family == "qwen2":
        return qwen2_lib.ModelConfig(**common, use_tied_embedding=is_tied(hf_config))
    if family == "qwen3":
        return Qwen3Config(**common, use_tied_embedding=is_tied(hf_config),
                           rope_inv_freq=rope_inv_freq(hf_config))
    return Llama3Config(**common, weight_tying=is_tied(hf_config), rope_inv_freq=rope_inv_freq(hf_config))


# ---------------------------------------------------------------------------------------------
# Models


# Per-layer gradient checkpointing (MaxText's remat_policy; "save_matmuls" is its "minimal"): what the
# forward pass keeps of each decoder layer for the backward pass.
REMAT_POLICIES: dict[str, Callable | None] = {
    "none": None,  # keep every activation: no recompute, the most memory
    "full": jax.checkpoint_policies.nothing_saveable,  # keep the layer's input; recompute the whole layer
    # keep the outputs of the weight matmuls (q/k/v/o, gate/up/down: dots without batch dimensions);
    # recompute norms, rope, attention and activations
    "save_matmuls": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
}


def _layer_fn(decoder_layer: Callable, graphdef: nnx.GraphDef, *, impl: str, policy: str,
              scanned: bool) -> Callable:
    """(layer state, x, sin, cos, segment_ids) -> x: one decoder layer rebuilt from its state, under
    jax.checkpoint with the named policy unless it is "none".

    The layer is a pure function of its state (nnx.merge inside), so the same function serves every layer of
    a scan and nothing a forward sets on its modules leaks out: qwix's LoRA (models/lora.py) records each
    einsum's LoRA equation on its module in every forward, which must not flow back out of a remat or a scan.
    """
    if policy not in REMAT_POLICIES:
        raise ValueError(f"remat policy must be one of {tuple(REMAT_POLICIES)}, got {policy!r}")

    def apply(state: nnx.State, x: jax.Array, sin: jax.Array, cos: jax.Array, segment_ids: jax.Array):
        return decoder_layer(nnx.merge(graphdef, state), x, sin, cos, segment_ids, impl=impl)

    if policy == "none":
        return apply
    # Under a scan nothing can be CSE'd across iterations, so jax.checkpoint's guard against it only costs
    # (JAX's advice for checkpoint inside scan); unrolled, it keeps XLA from undoing the rematerialisation.
    return jax.checkpoint(apply, policy=REMAT_POLICIES[policy], prevent_cse=not scanned)


def stack_layers(layers: Any) -> tuple[nnx.GraphDef, nnx.State]:
    """One layer's graph definition and every layer's state stacked along a new leading axis: the layers as
    they are stored (a StackedLayers, the learner's), or stacked here from tunix's per-layer list."""
    return (layers if isinstance(layers, StackedLayers) else StackedLayers(layers)).graphdef_and_state()


class _HiddenAndUnembed:
    """`hidden_states` + `unembed`, the two halves of tunix's `__call__` (mixin for the families).

    `hidden_states` runs the decoder layers itself, calling tunix's submodules, so that attention is
    `models.attention.attention` over segment ids. Static attributes the trainer sets (part of the graph
    definition): `attention_impl` (models.attention.IMPLEMENTATIONS), `remat_policy` (REMAT_POLICIES) and
    `scan_layers`.

    Layers under a scan (`scan_layers`, the default; MaxText's `scan_layers`): one `jax.lax.scan` runs the
    layer body over the layers' weights stacked along a leading axis, so XLA compiles one layer whatever the
    depth. The learner stores them stacked (models.stacked_layers: `layers` is then a StackedLayers, and the
    optimizer update runs once per weight kind too); a model with tunix's per-layer list (as loaded, exported
    and evaluated) stacks them inside the traced forward. `scan_layers = False` unrolls the layers (for
    debugging: one HLO op per layer).
    """

    embedder: Any
    layers: Any
    final_norm: Any
    attention_impl: str = "auto"
    remat_policy: str = "none"
    scan_layers: bool = True
    _lib: Any  # the tunix module of the family (its `shard`)

    def _rope_tables(self, positions: jax.Array) -> tuple[jax.Array, jax.Array]:
        """sin, cos [B, T, head_dim/2] float32 of the family's rope."""
        raise NotImplementedError

    @classmethod
    def _project_qkv(cls, attn: nnx.Module, x: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
        """q [B, T, Hq, D], k, v [B, T, Hkv, D] from the normed input (Llama3: the projections alone)."""
        return attn.q_proj(x), attn.k_proj(x), attn.v_proj(x)

    @classmethod
    def _decoder_layer(cls, layer: nnx.Module, x: jax.Array, sin: jax.Array, cos: jax.Array,
                       segment_ids: jax.Array, *, impl: str) -> jax.Array:
        """tunix's DecoderLayer.__call__ with its attention block's math, attention by `impl`:
        h = x + o_proj(attention(rope(q), rope(k), v)) of input_layernorm(x); h + mlp(post_norm(h))."""
        attn, shard = layer.attn, cls._lib.shard
        q, k, v = (shard(t, attn.shd_config.act_btnh) for t in cls._project_qkv(attn, layer.input_layernorm(x)))
        out = attention(rotate(q, sin, cos), rotate(k, sin, cos), v, segment_ids, impl=impl)
        h = x + shard(attn.o_proj(out), attn.shd_config.act_btd)
        return h + layer.mlp(layer.post_attention_layernorm(h))

    def hidden_states(self, input_tokens: jax.Array, positions: jax.Array, segment_ids: jax.Array) -> jax.Array:
        """Final-normed hidden states [B, T, D] (tunix's `__call__` up to the output projection).

        positions [B, T]: rope positions (restarting per packed sequence); segment_ids [B, T]: the
        sequences, 0 for padding (models.attention's contract: causal within each run).
        """
        x = self.embedder.encode(input_tokens)
        sin, cos = (t.astype(x.dtype) for t in self._rope_tables(positions))
        layer_fn = functools.partial(_layer_fn, type(self)._decoder_layer, impl=self.attention_impl,
                                     policy=self.remat_policy, scanned=self.scan_layers)
        if self.scan_layers:
            graphdef, stacked = stack_layers(self.layers)
            run = layer_fn(graphdef)
            # a scan's carry keeps one dtype: the one a layer's output takes (float32 adapters on a bf16 base
            # promote it, which an unrolled stack does from its second layer on)
            first = jax.tree.map(lambda value: value[0], stacked)
            x = x.astype(jax.eval_shape(run, first, x, sin, cos, segment_ids).dtype)
            x, _ = jax.lax.scan(lambda h, state: (run(state, h, sin, cos, segment_ids), None), x, stacked)
        elif isinstance(self.layers, StackedLayers):
            raise ValueError("layers stored stacked (models.stacked_layers) run under scan_layers only")
        else:  # unrolled; without remat on the modules themselves (qwix creates LoRA adapters on them so)
            for layer in self.layers:
                if self.remat_policy == "none":
                    x = type(self)._decoder_layer(layer, x, sin, cos, segment_ids, impl=self.attention_impl)
                else:
                    graphdef, state = nnx.split(layer)
                    x = layer_fn(graphdef)(state, x, sin, cos, segment_ids)
        return self.final_norm(x)

    @property
    def tied(self) -> bool:
        raise NotImplementedError

    def unembed(self, hidden: jax.Array) -> jax.Array:
        """Logits [..., V] from hidden states [..., D] (same math as tunix's output projection)."""
        if self.tied:
            return jnp.einsum("...d,vd->...v", hidden, self.embedder.input_embedding[...])
        return jnp.einsum("...d,dv->...v", hidden, self.lm_head.w[...])


class Qwen2(_HiddenAndUnembed, qwen2_lib.Qwen2, pytree=False):
    """tunix Qwen2 (its rope and tied embeddings already follow the config); q/k/v carry biases."""

    _lib = qwen2_lib

    @property
    def tied(self) -> bool:
        return self.config.use_tied_embedding

    def _rope_tables(self, positions: jax.Array) -> tuple[jax.Array, jax.Array]:
        return qwen2_lib._generate_pos_embeddings(positions, self.config.head_dim, self.config.rope_theta)

    @classmethod
    def _project_qkv(cls, attn: nnx.Module, x: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
        q, k, v = attn.q_proj(x), attn.k_proj(x), attn.v_proj(x)
        biases = (attn.q_bias[...], attn.k_bias[...], attn.v_bias[...])
        return tuple(t + b.reshape(t.shape[-2:]) for t, b in zip((q, k, v), biases, strict=True))


class _ConfigRope(_HiddenAndUnembed):
    """Llama3/Qwen3: rope frequencies from the HF config (theta, Llama 3 scaling), in our layers and,
    through the patched `apply_rope`, in tunix's own `__call__`."""

    def _rope_tables(self, positions: jax.Array) -> tuple[jax.Array, jax.Array]:
        return config_rope_tables(positions, self.config.rope_inv_freq)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with _config_rope(self.config.rope_inv_freq):
            return super().__call__(*args, **kwargs)


class _TiedHead(nnx.Module, pytree=False):
    """Output head sharing the embedder's table (tied embeddings for tunix's Qwen3)."""

    def __init__(self, embedder: nnx.Module):
        self.embedder = embedder

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.embedder.decode(x)


class Qwen3(_ConfigRope, qwen3_lib.Qwen3, pytree=False):
    """tunix Qwen3 with config rope and optional tied embeddings; q and k are RMS-normed per head."""

    _lib = qwen3_lib

    def __init__(self, config: Qwen3Config, *, rngs: nnx.Rngs,
                 shd_config: qwen3_lib.ShardingConfig | None = None):
        super().__init__(config, rngs=rngs, shd_config=shd_config or config.shd_config)
        if config.use_tied_embedding:
            self.lm_head = _TiedHead(self.embedder)

    @property
    def tied(self) -> bool:
        return self.config.use_tied_embedding

    @classmethod
    def _project_qkv(cls, attn: nnx.Module, x: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
        return attn.q_norm(attn.q_proj(x)), attn.k_norm(attn.k_proj(x)), attn.v_proj(x)


class Llama3(_ConfigRope, llama3_lib.Llama3, pytree=False):
    """tunix Llama3 with config rope (theta and Llama 3 scaling)."""

    _lib = llama3_lib

    @property
    def tied(self) -> bool:
        return self.config.weight_tying


MODEL_CLASSES = {"qwen2": Qwen2, "qwen3": Qwen3, "llama3": Llama3}
# tunix's own HF -> NNX key mapping (regex -> (nnx path, (permute, reshape))) for each family.
KEY_MAPPINGS = {
    "qwen2": qwen2_params._get_key_and_transform_mapping,
    "qwen3": qwen3_params._get_key_and_transform_mapping,
    "llama3": llama3_params._get_key_and_transform_mapping,
}

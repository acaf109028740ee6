"""LoRA adapters on the tunix families, applied with qwix as tunix does, in PEFT's names and layout.

    lora_loaded = apply_lora(loaded, LoraConfig(rank=8), dtype="float32")  # under jax.set_mesh(mesh)
    graphdef, adapters, base, rest = nnx.split(lora_loaded.model, nnx.LoRAParam, nnx.Param, ...)

qwix's `LoraProvider` intercepts the einsum / dot_general of every targeted projection (tunix's q/k/v/o
`Einsum` modules, the MLP's `nnx.Linear`) while `hidden_states` runs (our families' forward calls those
submodules: models/tunix_families.py), and adds scale · (x A) B beside it, scale = alpha / rank. Its
parameters sit next to the kernel they adapt, as `<kernel>_lora_a` / `<kernel>_lora_b` (`nnx.LoRAParam`,
a subclass of `nnx.Param`, so split them off first). A is qwix's default (He uniform), B zero: the adapted
model starts equal to its base.

Layouts: qwix's A is the kernel's input dims then r, B is r then the output dims (q_proj: kernel [embed,
heads, head_dim], A [embed, r], B [r, heads, head_dim]; o_proj: kernel [heads, head_dim, embed], A [heads,
head_dim, r], B [r, embed]; MLP: kernel [in, out], A [in, r], B [r, out]). Every targeted kernel is a
"transposed" tensor of models.hf_mapping (HF's W [out, in] = kernel.reshape(in, out).T), so PEFT's
A [r, in] = A.reshape(in, r).T, B [out, r] = B.reshape(r, out).T, and the merged kernel is
kernel + scale · (A.reshape(in, r) @ B.reshape(r, out)).reshape(kernel.shape).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import qwix
from flax import nnx
from jax.nn import initializers

from models.hf_mapping import TensorRule
from models.peft import LoraConfig

if TYPE_CHECKING:  # jax_model imports this module (its exports merge adapters)
    from models.jax_model import LoadedModel

LORA_A, LORA_B = "_lora_a", "_lora_b"  # qwix's suffixes of an adapter's params beside the kernel's name
FORWARD = "hidden_states"  # the method qwix intercepts: every targeted projection runs inside it


@dataclasses.dataclass(frozen=True)
class AdapterRule:
    """One adapted projection: its HF module, its tunix kernel and where qwix keeps A and B."""

    hf_module: str  # e.g. model.layers.0.self_attn.q_proj
    kernel_path: str  # the tunix path of the kernel it adapts, e.g. layers.0.attn.q_proj.w
    in_features: int
    out_features: int

    @property
    def a_path(self) -> str:
        return self.kernel_path + LORA_A

    @property
    def b_path(self) -> str:
        return self.kernel_path + LORA_B

    @property
    def module_path(self) -> str:
        """The adapted module's path as qwix matches it ("/"-joined)."""
        return self.kernel_path.rsplit(".", 1)[0].replace(".", "/")


def adapter_rules(tensor_rules: list[TensorRule], lora: LoraConfig) -> list[AdapterRule]:
    """The adapted projections of a model with these tensor rules (models.hf_mapping), in HF order."""
    rules = []
    for rule in tensor_rules:
        module, _, kind = rule.hf_name.rpartition(".")
        if kind != "weight" or module.rsplit(".", 1)[-1] not in lora.targets:
            continue
        if not rule.transposed:
            raise ValueError(f"{rule.hf_name}: LoRA needs a kernel laid out [in..., out...] in tunix")
        out_features, in_features = rule.hf_shape
        rules.append(AdapterRule(module, rule.tunix_path, in_features, out_features))
    return rules


def _in_dtype(initializer: Callable, dtype: Any) -> Callable:
    """`initializer` creating arrays of `dtype` whatever qwix asks for (it asks for the kernel's dtype)."""
    return lambda key, shape, _dtype=None: initializer(key, shape, dtype)


def apply_lora(loaded: LoadedModel, lora: LoraConfig, *, dtype: str = "float32", seed: int = 0) -> LoadedModel:
    """`loaded` with adapters of `lora` on its target projections, in
    `dtype` (their master dtype), A from `seed`, B zero; the base's arrays are shared, not copied. Call it
    under the mesh the model is placed on (jax.set_mesh): the adapters take their kernels' shardings."""
    if lora.dropout:
        # qwix applies LoRA dropout on every forward it intercepts (deterministic=False) and draws from
        # module rngs it unsets after init: the π_old, reference and evaluation passes would be noisy too.
        raise ValueError("model.lora.dropout > 0 is not supported by the learner; set it to 0")
    rules = adapter_rules(loaded.tensor_rules(), lora)
    provider = qwix.LoraProvider(
        module_path="|".join(re.escape(rule.module_path) for rule in rules), rank=lora.rank, alpha=lora.alpha,
        lora_a_initializer=_in_dtype(initializers.he_uniform(), jnp.dtype(dtype)),
        lora_b_initializer=_in_dtype(initializers.zeros, jnp.dtype(dtype)))
    tokens, segments = jnp.zeros((1, 1), jnp.int32), jnp.ones((1, 1), jnp.int32)
    # qwix creates the adapters on the modules its first forward runs: unrolled, without remat, that is the
    # model's own layers (a scanned forward runs copies rebuilt from their stacked state)
    scan_layers, remat_policy = loaded.model.scan_layers, loaded.model.remat_policy
    loaded.model.scan_layers, loaded.model.remat_policy = False, "none"
    model = qwix.apply_lora_to_model(loaded.model, provider, tokens, tokens, segments, methods=(FORWARD,),
                                     rngs=nnx.Rngs(seed))
    model.scan_layers, model.remat_policy = scan_layers, remat_policy
    # qwix subclasses the model's class with a bare type(...), which makes it a Flax pytree (the default):
    # our families are graph nodes (pytree=False), and as a pytree every submodule would turn static.
    qwix_class = type(model)
    model.__class__ = type(qwix_class.__name__, (qwix_class,), {}, pytree=False)
    created = {".".join(map(str, path)) for path, _ in nnx.to_flat_state(nnx.state(model, nnx.LoRAParam))}
    expected = {path for rule in rules for path in (rule.a_path, rule.b_path)}
    if created != expected:
        raise ValueError(f"qwix created adapters {sorted(created - expected)[:4]}, "
                         f"missed {sorted(expected - created)[:4]}")
    return dataclasses.replace(loaded, model=model, lora=lora)


def merged_kernel(kernel: jax.Array, a: jax.Array, b: jax.Array, scale: float) -> jax.Array:
    """kernel + scale · A B in the kernel's tunix layout, computed in float32."""
    rank = a.shape[-1]
    delta = a.reshape(-1, rank).astype(jnp.float32) @ b.reshape(rank, -1).astype(jnp.float32)
    return kernel.astype(jnp.float32) + scale * delta.reshape(kernel.shape)


def peft_layout(value: jax.Array, matrix: str, features: int) -> jax.Array:
    """qwix's A or B (`matrix`) in PEFT's layout, A [r, in] or B [out, r] (a reshape and a transpose);
    `features`: the adapted layer's in_features for A, out_features for B."""
    if matrix == "A":
        return value.reshape(features, -1).T
    return value.reshape(-1, features).T

"""LoRA adapters' layout on the tunix families: which projections a LoRA adapts, where qwix keeps A and B beside
each kernel, PEFT's layout of them, and the merged kernel (pure array math; models.lora applies adapters to a
model, models.jax_model exports them).

Layouts: qwix's A is the kernel's input dims then r, B is r then the output dims (q_proj: kernel [embed,
heads, head_dim], A [embed, r], B [r, heads, head_dim]; o_proj: kernel [heads, head_dim, embed], A [heads,
head_dim, r], B [r, embed]; MLP: kernel [in, out], A [in, r], B [r, out]). Every targeted kernel is a
"transposed" tensor of models.hf_mapping (HF's W [out, in] = kernel.reshape(in, out).T), so PEFT's
A [r, in] = A.reshape(in, r).T, B [out, r] = B.reshape(r, out).T, and the merged kernel is
kernel + scale · (A.reshape(in, r) @ B.reshape(r, out)).reshape(kernel.shape).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from models.hf_mapping import TensorRule
from models.peft import LoraConfig

LORA_A, LORA_B = "_lora_a", "_lora_b"  # qwix's suffixes of an adapter's params beside the kernel's name


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

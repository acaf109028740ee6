"""LoRA adapters on the tunix families, applied with qwix as tunix does, in PEFT's names and layout.

    lora_loaded = apply_lora(loaded, LoraConfig(rank=8), dtype="float32")  # under jax.set_mesh(mesh)
    graphdef, adapters, base, rest = nnx.split(lora_loaded.model, nnx.LoRAParam, nnx.Param, ...)

qwix's `LoraProvider` intercepts the einsum / dot_general of every targeted projection (tunix's q/k/v/o
`Einsum` modules, the MLP's `nnx.Linear`) while `hidden_states` runs (our families' forward calls those
submodules: models/tunix_families.py), and adds scale · (x A) B beside it, scale = alpha / rank. Its
parameters sit next to the kernel they adapt, as `<kernel>_lora_a` / `<kernel>_lora_b` (`nnx.LoRAParam`,
a subclass of `nnx.Param`, so split them off first). A is qwix's default (He uniform), B zero: the adapted
model starts equal to its base.

The adapters' layout, PEFT's layout of them and the merged kernel: models.lora_layout.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from typing import Any

import jax.numpy as jnp
import qwix
from flax import nnx
from jax.nn import initializers

from models.jax_model import LoadedModel
from models.lora_layout import adapter_rules
from models.peft import LoraConfig

FORWARD = "hidden_states"  # the method qwix intercepts: every targeted projection runs inside it


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

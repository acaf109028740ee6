"""One API over tunix's Flax NNX families: load a HF dir onto a mesh, forward, export back to HF.

    loaded = load_model(hf_dir, mesh=make_mesh(fsdp=4, tp=2), dtype="bfloat16")
    hidden = forward_hidden(loaded.model, ids, mask)      # [B, T, D], final-normed
    logits = unembed(loaded.model, hidden[:, :64])        # chunk by chunk, never [B, T, V] at once
    for name, array in export_hf_tensors(loaded): ...     # HF names/layout, for vLLM
    save_hf_dir(loaded, out_dir, tokenizer_dir=hf_dir)    # a dir transformers and vLLM load

With LoRA (models.lora.apply_lora) the HF export is the merged weights W + (alpha/r)·B·A, and the
adapters alone export in PEFT's names and layout (`export_adapter_tensors`, `save_adapter_dir`).
"""

from __future__ import annotations

import collections
import functools
import json
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.experimental import multihost_utils
from safetensors import safe_open
from safetensors.numpy import save_file
from tunix.models import safetensors_loader

from models.families import family_of, hf_param_shapes, is_tied
from models.hf_mapping import TensorRule, tensor_rules, to_hf_layout
from models.lora_layout import AdapterRule, adapter_rules, merged_kernel, peft_layout
from models.peft import ADAPTER_CONFIG, ADAPTER_WEIGHTS, LoraConfig, adapter_config, peft_name
from models.tunix_families import KEY_MAPPINGS, MODEL_CLASSES, tunix_config

MESH_AXES = ("fsdp", "tp")
DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}
# Files of a HF dir that describe the tokenizer (and generation defaults), copied by save_hf_dir.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json",
                   "merges.txt", "tokenizer.model", "added_tokens.json", "chat_template.jinja",
                   "chat_template.json", "generation_config.json")
MAX_SHARD_BYTES = 4 * 1024**3
# Tensors whose layout change and device->host copy are in flight while the caller consumes one.
EXPORT_PREFETCH = 4


@dataclass
class LoadedModel:
    """A tunix model built from a HF dir, with the configs it came from (and its LoRA, if applied)."""

    model: nnx.Module
    family: str
    hf_config: dict
    config: Any  # the tunix ModelConfig
    hf_dir: Path | None = None  # the dir it was loaded from: the base of its adapters
    lora: LoraConfig | None = None  # set by models.lora.apply_lora

    def tensor_rules(self) -> list[TensorRule]:
        """HF name, tunix path and layout of every exported tensor."""
        return tensor_rules(self.hf_config, self.config, KEY_MAPPINGS[self.family])

    def adapter_rules(self) -> list[AdapterRule]:
        """The projections its LoRA adapts (none without LoRA)."""
        return [] if self.lora is None else adapter_rules(self.tensor_rules(), self.lora)


def _dtype(name: str) -> Any:
    if name not in DTYPES:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {name!r}")
    return DTYPES[name]


def make_mesh(fsdp: int = 1, tp: int = 1, devices: list | None = None) -> jax.sharding.Mesh:
    """A ("fsdp", "tp") mesh over the first fsdp*tp devices, Auto axes (tunix's sharding constraints
    do not work under Explicit axes)."""
    devices = list(jax.devices() if devices is None else devices)
    if fsdp < 1 or tp < 1 or fsdp * tp > len(devices):
        raise ValueError(f"mesh fsdp={fsdp} x tp={tp} needs {fsdp * tp} devices, have {len(devices)}")
    return jax.make_mesh((fsdp, tp), MESH_AXES, axis_types=(jax.sharding.AxisType.Auto,) * 2,
                         devices=devices[: fsdp * tp])


def read_hf_config(hf_dir: Path) -> dict:
    """config.json of a HF model dir."""
    path = Path(hf_dir) / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"{hf_dir} is not a HF model dir: no config.json")
    return json.loads(path.read_text())


def _check_checkpoint(hf_dir: Path, hf_config: dict) -> None:
    """Fail with a clear message unless the safetensors hold exactly the family's tensors."""
    files = sorted(Path(hf_dir).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors in {hf_dir}")
    found: dict[str, tuple[int, ...]] = {}
    for file in files:
        with safe_open(file, framework="numpy") as f:
            found.update({k: tuple(f.get_slice(k).get_shape()) for k in f.keys()})
    expected = hf_param_shapes(hf_config)
    if is_tied(hf_config):
        found.pop("lm_head.weight", None)  # some tied checkpoints store the copy; it is unused
    missing = sorted(set(expected) - set(found))
    extra = sorted(set(found) - set(expected))
    wrong = sorted(k for k in set(found) & set(expected) if found[k] != expected[k])
    if missing or extra or wrong:
        raise ValueError(
            f"{hf_dir} does not match its config.json ({family_of(hf_config)}): missing {missing[:5]}, "
            f"unexpected {extra[:5]}, wrong shape {[(k, found[k], expected[k]) for k in wrong[:5]]}")


def load_model(hf_dir: Path, *, mesh: jax.sharding.Mesh | None = None,
               dtype: str = "float32") -> LoadedModel:
    """Build the family's tunix model from a HF dir with tunix's safetensors loader.

    Params are cast to `dtype` and placed with the family's sharding annotations on `mesh`
    (on the default device when mesh is None).
    """
    hf_dir = Path(hf_dir)
    hf_config = read_hf_config(hf_dir)
    family = family_of(hf_config)
    jax_dtype = _dtype(dtype)
    _check_checkpoint(hf_dir, hf_config)
    config = tunix_config(hf_config)
    model = safetensors_loader.load_and_create_model(
        file_dir=str(hf_dir), model_class=MODEL_CLASSES[family], config=config,
        key_mapping=KEY_MAPPINGS[family], mesh=mesh, preprocess_fn=None, dtype=jax_dtype)
    unloaded = [path for path, value in nnx.to_flat_state(nnx.state(model, nnx.Param))
                if not isinstance(value.get_value(), jax.Array)]
    if unloaded:
        raise ValueError(f"{hf_dir}: no tensor was loaded for {unloaded[:5]}")
    return LoadedModel(model=model, family=family, hf_config=hf_config, config=config, hf_dir=hf_dir.absolute())


def positions_and_segments(attention_mask: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Positions [B, T] = cumsum(mask) - 1 clipped at 0, and segment ids [B, T]: 1 on the row's tokens,
    0 on its padding (one sequence per row, left or right padded; models.attention's contract)."""
    mask = attention_mask.astype(bool)
    positions = jnp.maximum(jnp.cumsum(mask.astype(jnp.int32), axis=-1) - 1, 0)
    return positions, mask.astype(jnp.int32)


def forward_hidden(model: nnx.Module, input_ids: jax.Array, attention_mask: jax.Array) -> jax.Array:
    """Final-normed hidden states [B, T, D] of padded rows; `unembed(model, h)` turns them into logits."""
    return model.hidden_states(input_ids, *positions_and_segments(attention_mask))


def unembed(model: nnx.Module, hidden: jax.Array) -> jax.Array:
    """Logits [..., V] (in the params' dtype) from final-normed hidden states [..., D]."""
    return model.unembed(hidden)


def forward_logits(model: nnx.Module, input_ids: jax.Array, attention_mask: jax.Array) -> jax.Array:
    """Logits [B, T, V]: forward_hidden then unembed."""
    return unembed(model, forward_hidden(model, input_ids, attention_mask))


@functools.partial(jax.jit, static_argnums=(1, 2, 3))
def _hf_layout_on_device(value: jax.Array, hf_shape: tuple[int, ...], transposed: bool,
                         dtype: Any) -> jax.Array:
    # On the device: XLA's tiled, multi-threaded transpose is 2-3x numpy's even on CPU, and the host
    # then receives a contiguous buffer (already cast, so half the bytes for bf16).
    return to_hf_layout(value.astype(dtype), hf_shape, transposed)


@functools.partial(jax.jit, static_argnums=(3, 4, 5))
def _merged_hf_layout_on_device(kernel: jax.Array, a: jax.Array, b: jax.Array, hf_shape: tuple[int, ...],
                                dtype: Any, scale: float) -> jax.Array:
    return to_hf_layout(merged_kernel(kernel, a, b, scale).astype(dtype), hf_shape, True)


@functools.partial(jax.jit, static_argnums=(1, 2, 3))
def _peft_layout_on_device(value: jax.Array, matrix: str, features: int, dtype: Any) -> jax.Array:
    return peft_layout(value.astype(dtype), matrix, features)


def _to_host(named: Iterator[tuple[str, jax.Array]]) -> Iterator[tuple[str, np.ndarray]]:
    """(name, host array) of each (name, device array), in order: EXPORT_PREFETCH copies in flight ahead of
    the consumer; an array other processes hold shards of is all-gathered at once (every process in step)."""
    in_flight: collections.deque[tuple[str, jax.Array]] = collections.deque()
    for name, out in named:
        if not out.is_fully_addressable:  # another process holds shards of it: gather now, in step
            yield name, np.asarray(multihost_utils.process_allgather(out, tiled=True))
            continue
        out.copy_to_host_async()
        in_flight.append((name, out))
        if len(in_flight) > EXPORT_PREFETCH:
            name, array = in_flight.popleft()
            yield name, np.asarray(jax.device_get(array))
    while in_flight:
        name, array = in_flight.popleft()
        yield name, np.asarray(jax.device_get(array))


def _params(loaded: LoadedModel) -> dict[str, Any]:
    """The model's parameters (adapters included) by "."-joined tunix path."""
    return {".".join(map(str, path)): var.get_value()
            for path, var in nnx.to_flat_state(nnx.state(loaded.model, nnx.Param))}


def export_hf_tensors(loaded: LoadedModel, dtype: str | None = None) -> Iterator[tuple[str, np.ndarray]]:
    """(HF name, host array in HF layout, C-contiguous) for every tensor of the family, in
    `hf_param_shapes` order, optionally cast to dtype (default: each tensor's own). With LoRA, an adapted
    kernel exports merged: W + (alpha/r)·B·A, summed in float32.

    Cast, merge and layout change run on the device, EXPORT_PREFETCH tensors ahead of the consumer, with
    their host copies started asynchronously. Without adapters only reshapes, transposes and (if asked) a
    cast: a round trip at the loaded dtype is bit-exact. Arrays may be read-only views.

    With parameters sharded over several processes every process must iterate this in step (each
    tensor is all-gathered, one at a time, so no host holds more than one extra tensor at once).
    """
    target = None if dtype is None else _dtype(dtype)
    params = _params(loaded)
    adapted = {rule.kernel_path: rule for rule in loaded.adapter_rules()}

    def on_device() -> Iterator[tuple[str, jax.Array]]:
        for rule in loaded.tensor_rules():
            value = params[rule.tunix_path]
            if (adapter := adapted.get(rule.tunix_path)) is None:
                yield rule.hf_name, _hf_layout_on_device(value, rule.hf_shape, rule.transposed, target or value.dtype)
            else:
                yield rule.hf_name, _merged_hf_layout_on_device(
                    value, params[adapter.a_path], params[adapter.b_path], rule.hf_shape, target or value.dtype,
                    loaded.lora.scale)

    return _to_host(on_device())


def export_adapter_tensors(loaded: LoadedModel, dtype: str | None = None) -> Iterator[tuple[str, np.ndarray]]:
    """(PEFT name, host array) of every adapter of a LoRA model (models.peft.adapter_shapes' names, A [r, in],
    B [out, r]), in HF module order, optionally cast to dtype; every process in step, as export_hf_tensors."""
    if loaded.lora is None:
        raise ValueError("the model has no LoRA adapters (models.lora.apply_lora)")
    target = None if dtype is None else _dtype(dtype)
    params = _params(loaded)

    def on_device() -> Iterator[tuple[str, jax.Array]]:
        for rule in loaded.adapter_rules():
            for matrix, path, features in (("A", rule.a_path, rule.in_features),
                                           ("B", rule.b_path, rule.out_features)):
                value = params[path]
                yield peft_name(rule.hf_module, matrix), _peft_layout_on_device(value, matrix, features,
                                                                               target or value.dtype)

    return _to_host(on_device())


def _replace_atomically(path: Path, write: Any) -> None:
    """write(tmp_path) then rename over `path`, so readers never see a half-written file."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def save_hf_dir(loaded: LoadedModel, out_dir: Path, *, tokenizer_dir: Path,
                dtype: str | None = None) -> Path:
    """Write a HF model dir (config.json, safetensors, tokenizer files from `tokenizer_dir`).

    Weights larger than MAX_SHARD_BYTES are split into HF-style shards with an index. Safetensors
    left in `out_dir` by an earlier save and not rewritten now are removed.
    """
    out_dir, tokenizer_dir = Path(out_dir), Path(tokenizer_dir)
    tokenizer_files = [tokenizer_dir / n for n in TOKENIZER_FILES if (tokenizer_dir / n).is_file()]
    if not any(p.name in ("tokenizer.json", "tokenizer.model", "vocab.json") for p in tokenizer_files):
        raise FileNotFoundError(f"no tokenizer files in {tokenizer_dir}")
    out_dir.mkdir(parents=True, exist_ok=True)

    shards: list[dict[str, np.ndarray]] = [{}]
    shard_bytes = 0
    for name, array in export_hf_tensors(loaded, dtype):
        if shards[-1] and shard_bytes + array.nbytes > MAX_SHARD_BYTES:
            shards.append({})
            shard_bytes = 0
        shards[-1][name] = array
        shard_bytes += array.nbytes
    if len(shards) == 1:
        file_names = ["model.safetensors"]
    else:
        file_names = [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    for file_name, tensors in zip(file_names, shards, strict=True):
        _replace_atomically(out_dir / file_name,
                            lambda p, t=tensors: save_file(t, str(p), metadata={"format": "pt"}))
    index_path = out_dir / "model.safetensors.index.json"
    if len(shards) > 1:
        index = {"metadata": {"total_size": sum(a.nbytes for s in shards for a in s.values())},
                 "weight_map": {name: f for f, s in zip(file_names, shards, strict=True) for name in s}}
        _replace_atomically(index_path, lambda p: p.write_text(json.dumps(index, indent=2)))
    else:
        index_path.unlink(missing_ok=True)
    for stale in set(out_dir.glob("*.safetensors")) - {out_dir / f for f in file_names}:
        stale.unlink()

    saved_dtype = dtype or str(np.dtype(next(iter(shards[0].values())).dtype))
    config = {**loaded.hf_config, "torch_dtype": saved_dtype}
    config.pop("dtype", None)
    _replace_atomically(out_dir / "config.json", lambda p: p.write_text(json.dumps(config, indent=2)))
    for src in tokenizer_files:
        if src.resolve() != (out_dir / src.name).resolve():
            _replace_atomically(out_dir / src.name, lambda p, s=src: shutil.copyfile(s, p))
    return out_dir


def save_adapter_dir(loaded: LoadedModel, out_dir: Path, *, dtype: str | None = None) -> Path:
    """Write a LoRA model's adapters as a PEFT dir (adapter_config.json naming `loaded.hf_dir` as the base,
    adapter_model.safetensors) that peft + transformers and vLLM load over that base. Process 0 only:
    multi-host, the others iterate export_adapter_tensors in step."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tensors = dict(export_adapter_tensors(loaded, dtype))
    _replace_atomically(out_dir / ADAPTER_WEIGHTS, lambda p: save_file(tensors, str(p), metadata={"format": "pt"}))
    config = adapter_config(loaded.lora, str(loaded.hf_dir or ""))
    _replace_atomically(out_dir / ADAPTER_CONFIG, lambda p: p.write_text(json.dumps(config, indent=2)))
    return out_dir

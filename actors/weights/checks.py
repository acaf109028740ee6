"""The checks a weight version passes before an engine loads it, and the engine as the weight wing sees it.

A full version must name exactly the engine's checkpoint tensors (names, shapes, float dtypes, finite
values); an adapter version the model's PEFT names and shapes (actors/weights/adapter_check.py). Every
problem is listed in one WeightSetError, and a version that raises it is never loaded: the actor keeps
serving the one it has. The wing (apply.py, adapter_check.py) names the engine only through
`WeightEngine`, so actors/engine.py imports this package and nothing here imports it back.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from actors.weights.finite_scan import has_nonfinite
from models.peft import LoraConfig

FLOAT_DTYPES = ("float32", "float16", "bfloat16")


class WeightSetError(ValueError):
    """A weight set does not match the engine's tensors (names, shapes, dtypes or non-finite values)."""


@dataclass(frozen=True)
class CheckedWeights:
    """A weight set ``RolloutEngine.check_weights`` accepted: loading it needs no second check."""

    tensors: dict[str, np.ndarray]


@dataclass(frozen=True)
class CheckedAdapter:
    """An adapter version actors/weights/adapter_check.py accepted: `config` is its adapter_config.json."""

    version: int
    config: dict[str, Any]
    tensors: dict[str, np.ndarray]


@dataclass(frozen=True)
class TensorSpec:
    shape: tuple[int, ...]
    dtype: str


def checkpoint_tensor_specs(hf_dir: Path) -> dict[str, TensorSpec]:
    """Names, shapes and dtypes of every tensor in the HF dir's safetensors files (headers only)."""
    from safetensors import safe_open

    files = sorted(Path(hf_dir).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors in {hf_dir}")
    specs: dict[str, TensorSpec] = {}
    for path in files:
        with safe_open(str(path), framework="np") as f:
            for name in f.keys():
                sl = f.get_slice(name)
                specs[name] = TensorSpec(tuple(sl.get_shape()), sl.get_dtype())
    return specs


def named_arrays(tensors: Iterable[tuple[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """The (name, array) pairs as a dict; WeightSetError if a name comes twice."""
    named: dict[str, np.ndarray] = {}
    for name, array in tensors:
        if name in named:
            raise WeightSetError(f"rejected weight set: duplicate tensor {name}")
        named[name] = np.asarray(array)
    return named


def validate_weight_set(expected: dict[str, TensorSpec], tensors: dict[str, np.ndarray],
                        nonfinite: Collection[str] | None = None) -> None:
    """Raise WeightSetError unless ``tensors`` has exactly the expected names and shapes, float dtypes
    and finite values. Every problem is listed, so one error says all that is wrong. `nonfinite`: the
    tensors a scan already found non-finite (StagedWeights.nonfinite); None scans them here."""
    problems: list[str] = []
    missing = sorted(set(expected) - set(tensors))
    unknown = sorted(set(tensors) - set(expected))
    if missing:
        problems.append(f"missing {len(missing)} tensor(s): {missing[:5]}")
    if unknown:
        problems.append(f"unknown {len(unknown)} tensor(s): {unknown[:5]}")
    for name, array in tensors.items():
        spec = expected.get(name)
        if spec is None:
            continue
        if tuple(array.shape) != spec.shape:
            problems.append(f"{name}: shape {tuple(array.shape)} != expected {spec.shape}")
        elif array.dtype.name not in FLOAT_DTYPES:
            problems.append(f"{name}: dtype {array.dtype.name} is not one of {FLOAT_DTYPES}")
        elif name in nonfinite if nonfinite is not None else has_nonfinite(array):
            problems.append(f"{name}: contains non-finite values")
    if problems:
        raise WeightSetError("rejected weight set: " + "; ".join(problems))


class WeightEngine(Protocol):
    """What the weight wing needs of an engine (actors/engine.py's RolloutEngine is one)."""

    hf_dir: Path
    lora: LoraConfig | None  # None: the engine serves full weights
    adapter_shapes: dict[str, tuple[int, ...]]  # the model's PEFT tensors and shapes ({} without LoRA)

    def check_weights(self, tensors: Iterable[tuple[str, np.ndarray]],
                      nonfinite: Collection[str] | None = None) -> CheckedWeights: ...

    def load_weights(self, weights: CheckedWeights, version: int | None = None) -> float: ...

    def update_in_flight(self, weights: CheckedWeights, version: int) -> Any: ...  # its .stall_s: seconds

    def load_adapter(self, adapter: CheckedAdapter) -> float: ...

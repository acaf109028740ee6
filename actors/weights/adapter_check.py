"""The door of an adapter version (the ADAPTER kind's check, actors/weights/apply.py): what the header
says the adapters are and what the blob holds, checked while the engine keeps sampling.

The header's adapter config must be the run's (`model.lora`, which the actor was started with): the same
PEFT type, rank, alpha, targets, bias and layout as models.peft.adapter_config writes, key for key (only
the base model's path and the training dropout may differ). The tensors must be exactly those
models.peft.adapter_shapes names for the engine's model (A [r, in], B [out, r]), each a float dtype with
finite values. Anything else is refused before the engine is touched, and the actor keeps serving the
version it has. What is written for vLLM is the actor's own adapter_config.json, naming its base.
"""

from __future__ import annotations

from typing import Any

from actors.weights.checks import (
    CheckedAdapter,
    TensorSpec,
    WeightEngine,
    WeightSetError,
    named_arrays,
    validate_weight_set,
)
from actors.weights.staged import StagedWeights
from models.peft import LoraConfig, adapter_config

FREE_KEYS = ("base_model_name_or_path", "lora_dropout")  # may differ: not part of what the adapters compute


def config_problems(config: dict[str, Any] | None, lora: LoraConfig) -> list[str]:
    """What differs between an adapter version's config (its header's) and the run's `lora`."""
    if config is None:
        return ["no adapter config in its header"]
    expected = adapter_config(lora, base_model="")
    problems = []
    missing, unknown = sorted(set(expected) - set(config)), sorted(set(config) - set(expected))
    if missing or unknown:
        problems.append(f"adapter config keys: missing {missing[:5]}, unknown {unknown[:5]}")
    for key in sorted(set(expected) & set(config) - set(FREE_KEYS)):
        theirs, ours = config[key], expected[key]
        if key == "target_modules" and isinstance(theirs, list):  # a set, in any order
            theirs, ours = sorted(map(str, theirs)), sorted(ours)
        if not _same(theirs, ours):
            problems.append(f"adapter config {key}={repr(theirs)[:100]}, this run's is {ours!r}")
    return problems


def _same(theirs: Any, ours: Any) -> bool:
    """Equal JSON values; a number may be an int on one side and a float on the other, a bool only a bool."""
    if isinstance(theirs, bool) or isinstance(ours, bool):
        return type(theirs) is type(ours) and theirs == ours
    return theirs == ours


def check_adapter(engine: WeightEngine, staged: StagedWeights) -> CheckedAdapter:
    """`staged` as an adapter version `engine` can load; WeightSetError listing every problem otherwise."""
    if engine.lora is None:
        raise WeightSetError("rejected adapter version: this actor serves full weights (model.lora is unset)")
    problems = config_problems(staged.adapter, engine.lora)
    if problems:
        raise WeightSetError("rejected adapter version: " + "; ".join(problems))
    named = named_arrays(staged.tensors)
    validate_weight_set({name: TensorSpec(shape, "") for name, shape in engine.adapter_shapes.items()}, named,
                        staged.nonfinite)
    return CheckedAdapter(staged.version, adapter_config(engine.lora, str(engine.hf_dir)), named)

"""LoRA adapters in PEFT's format: the contract between the learner (which trains and exports adapters)
and the rollout actors (whose vLLM engine loads them), as `families.hf_param_shapes` is for full weights.
Pure Python: no jax, no torch.

An adapter on the linear layer W [out, in] of HF module `m` (e.g. `model.layers.3.self_attn.q_proj`) is

    W' = W + (alpha / rank) · B A,    A [rank, in] (PEFT's lora_A), B [out, rank] (PEFT's lora_B)

stored as `base_model.model.<m>.lora_A.weight` and `...lora_B.weight` in `adapter_model.safetensors`,
beside `adapter_config.json` (what `peft.PeftModel.from_pretrained` and vLLM's `LoRARequest` read).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from models.families import hf_param_shapes

# The linear layers an adapter may target, by their HF module name's last part.
TARGETS: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"


class LoraConfig(BaseModel):
    """LoRA on the policy (`model.lora`): the base weights stay frozen in the compute dtype; the adapters,
    their float32 master and AdamW's moments are all that trains, and each weight version is the
    adapters only."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    rank: int = Field(8, ge=1, description="r: the adapters' inner dimension")
    alpha: float = Field(16.0, gt=0, description="the update is scaled by alpha / rank")
    dropout: float = Field(0.0, ge=0, lt=1, description="dropout on the adapter's input while training; the "
                                                          "learner takes 0 only (qwix would drop on every forward, "
                                                          "the π_old and reference passes too)")
    targets: tuple[str, ...] = Field(TARGETS, description=f"linear layers that get an adapter, of {TARGETS}")

    @model_validator(mode="after")
    def _known_targets(self) -> LoraConfig:
        unknown = sorted(set(self.targets) - set(TARGETS))
        if unknown or not self.targets:
            raise ValueError(f"lora targets must be a non-empty subset of {TARGETS}, got {list(self.targets)}")
        return self

    @property
    def scale(self) -> float:
        return self.alpha / self.rank


def peft_name(hf_module: str, matrix: str) -> str:
    """PEFT's tensor name of `matrix` ("A" or "B") of the adapter on HF module `hf_module`."""
    if matrix not in ("A", "B"):
        raise ValueError(f"matrix must be 'A' or 'B', got {matrix!r}")
    return f"base_model.model.{hf_module}.lora_{matrix}.weight"


def adapter_shapes(hf_config: dict[str, Any], lora: LoraConfig) -> dict[str, tuple[int, ...]]:
    """Every adapter tensor's PEFT name and shape for a checkpoint of this config (A [r, in], B [out, r])."""
    shapes = {}
    for name, shape in hf_param_shapes(hf_config).items():
        module, _, kind = name.rpartition(".")
        if kind == "weight" and module.rsplit(".", 1)[-1] in lora.targets:
            out_features, in_features = shape
            shapes[peft_name(module, "A")] = (lora.rank, in_features)
            shapes[peft_name(module, "B")] = (out_features, lora.rank)
    return shapes


def adapter_config(lora: LoraConfig, base_model: str) -> dict[str, Any]:
    """adapter_config.json of an adapter trained on `base_model` (a HF dir or hub name)."""
    return {"peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": base_model,
            "r": lora.rank, "lora_alpha": lora.alpha, "lora_dropout": lora.dropout, "bias": "none",
            "target_modules": list(lora.targets), "fan_in_fan_out": False, "inference_mode": True}

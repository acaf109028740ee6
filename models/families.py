"""Supported model families and the HF tensor layout each one has (pure Python: no jax, no torch).

`hf_param_shapes` is the contract between the learner (which exports tensors under these names)
and the rollout actors (whose vLLM engine loads them): the names and shapes a HF checkpoint of that
family holds, and therefore what vLLM's loader for the architecture expects.
"""

from __future__ import annotations

from typing import Any

FAMILIES = ("qwen2", "qwen3", "llama3")

# HF `model_type` -> family. Llama 2 shares the Llama 3 architecture (it differs in rope settings only).
_MODEL_TYPES = {"qwen2": "qwen2", "qwen3": "qwen3", "llama": "llama3"}
ARCHITECTURES = {"qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM", "llama3": "LlamaForCausalLM"}
HF_MODEL_TYPES = {family: model_type for model_type, family in _MODEL_TYPES.items()}


def family_of(hf_config: dict[str, Any]) -> str:
    """The family of a HF config.json dict; ValueError naming the supported ones otherwise."""
    model_type = hf_config.get("model_type")
    if model_type not in _MODEL_TYPES:
        raise ValueError(
            f"unsupported model_type {model_type!r} (architectures {hf_config.get('architectures')}); "
            f"supported model_types: {sorted(_MODEL_TYPES)}"
        )
    return _MODEL_TYPES[model_type]


def head_dim_of(hf_config: dict[str, Any]) -> int:
    """Per-head dimension as transformers reads it (Qwen3's config class defaults it to 128)."""
    head_dim = hf_config.get("head_dim")
    if head_dim is not None:
        return int(head_dim)
    if family_of(hf_config) == "qwen3":
        return 128
    return hf_config["hidden_size"] // hf_config["num_attention_heads"]


def kv_heads_of(hf_config: dict[str, Any]) -> int:
    """Number of key/value heads (configs without the key use plain multi-head attention)."""
    return int(hf_config.get("num_key_value_heads") or hf_config["num_attention_heads"])


def is_tied(hf_config: dict[str, Any]) -> bool:
    """Whether the output projection reuses the input embedding (no `lm_head.weight` tensor).

    All supported families' config classes default `tie_word_embeddings` to False.
    """
    return bool(hf_config.get("tie_word_embeddings", False))


def rope_settings(hf_config: dict[str, Any]) -> tuple[float, dict[str, Any] | None]:
    """(rope_theta, rope scaling dict or None) from either config spelling.

    transformers 5 writes `rope_parameters` ({"rope_type", "rope_theta", ...}); older checkpoints
    write `rope_theta` and `rope_scaling`. A "default" rope type means no scaling.
    """
    params = dict(hf_config.get("rope_parameters") or {})
    scaling = hf_config.get("rope_scaling") or {}
    theta = params.pop("rope_theta", hf_config.get("rope_theta", 10_000.0))
    merged = {**params, **scaling}
    rope_type = merged.get("rope_type", merged.get("type", "default"))
    if rope_type == "default":
        return float(theta), None
    return float(theta), {**merged, "rope_type": rope_type}


SUPPORTED_ROPE_TYPES = ("default", "llama3")


def check_supported(hf_config: dict[str, Any]) -> None:
    """Raise ValueError if the config uses a feature the JAX families cannot represent."""
    family = family_of(hf_config)
    problems = []
    if hf_config.get("hidden_act", "silu") != "silu":
        problems.append(f"hidden_act={hf_config['hidden_act']!r} (only silu)")
    if family != "qwen2" and hf_config.get("attention_bias", False):
        problems.append("attention_bias=true")
    if hf_config.get("mlp_bias", False):
        problems.append("mlp_bias=true")
    if hf_config.get("use_sliding_window", False):
        problems.append("use_sliding_window=true")
    if hf_config.get("num_experts") or hf_config.get("num_local_experts"):
        problems.append("mixture-of-experts layers")
    _, scaling = rope_settings(hf_config)
    if scaling is not None and scaling["rope_type"] not in SUPPORTED_ROPE_TYPES:
        problems.append(f"rope_type={scaling['rope_type']!r} (supported: {SUPPORTED_ROPE_TYPES})")
    if scaling is not None and family == "qwen2":
        problems.append("rope scaling on qwen2 (tunix's Qwen2 applies plain rope)")
    if hf_config["num_attention_heads"] % kv_heads_of(hf_config):
        problems.append("num_attention_heads not a multiple of num_key_value_heads")
    if problems:
        raise ValueError(f"unsupported {family} config: " + "; ".join(problems))


def has_qkv_bias(hf_config: dict[str, Any]) -> bool:
    """Only Qwen2 has q/k/v biases (check_supported rejects attention_bias on the others)."""
    return family_of(hf_config) == "qwen2"


def hf_param_shapes(hf_config: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """Every HF tensor name of a dense checkpoint of this family, with its shape."""
    check_supported(hf_config)
    family = family_of(hf_config)
    d = hf_config["hidden_size"]
    f = hf_config["intermediate_size"]
    v = hf_config["vocab_size"]
    n = hf_config["num_attention_heads"]
    k = kv_heads_of(hf_config)
    h = head_dim_of(hf_config)
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (v, d), "model.norm.weight": (d,)}
    for i in range(hf_config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        shapes.update({
            p + "input_layernorm.weight": (d,),
            p + "post_attention_layernorm.weight": (d,),
            p + "self_attn.q_proj.weight": (n * h, d),
            p + "self_attn.k_proj.weight": (k * h, d),
            p + "self_attn.v_proj.weight": (k * h, d),
            p + "self_attn.o_proj.weight": (d, n * h),
            p + "mlp.gate_proj.weight": (f, d),
            p + "mlp.up_proj.weight": (f, d),
            p + "mlp.down_proj.weight": (d, f),
        })
        if has_qkv_bias(hf_config):
            shapes.update({
                p + "self_attn.q_proj.bias": (n * h,),
                p + "self_attn.k_proj.bias": (k * h,),
                p + "self_attn.v_proj.bias": (k * h,),
            })
        if family == "qwen3":
            shapes.update({p + "self_attn.q_norm.weight": (h,), p + "self_attn.k_norm.weight": (h,)})
    if not is_tied(hf_config):
        shapes["lm_head.weight"] = (v, d)
    return shapes

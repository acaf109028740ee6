"""Tiny random HF checkpoints of any supported family, built offline (numpy + safetensors + json).

The directory is a complete HF model dir (config.json, model.safetensors, tokenizer files) that
transformers, vLLM and `models.jax_model.load_model` all load, exactly like a real checkpoint.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
from safetensors.numpy import save_file

from models.families import ARCHITECTURES, FAMILIES, HF_MODEL_TYPES, hf_param_shapes
from models.tokenizer import (
    BOS_ID,
    CHATML_PAD_ID,
    DEFAULT_ALPHABET,
    EOS_ID,
    IM_END_ID,
    PAD_ID,
    build_char_tokenizer,
    build_chatml_tokenizer,
    vocab_size_for,
)

INIT_STD = 0.02
# Each family's usual rope settings, so the tiny models exercise the same code paths as real ones.
_ROPE = {
    "qwen2": {"rope_theta": 1_000_000.0},
    "qwen3": {"rope_theta": 1_000_000.0},
    "llama3": {"rope_theta": 500_000.0},
}


def _llama3_rope_scaling(max_position_embeddings: int) -> dict[str, Any]:
    """Llama 3.2's frequency-dependent rope scaling, its original context shrunk to fit the model
    (transformers wants it below max_position_embeddings); all three frequency bands stay in use."""
    return {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": max(1, max_position_embeddings // 4)}


def tiny_hf_config(*, family: str, vocab_size: int, num_layers: int, hidden_size: int,
                   intermediate_size: int, num_heads: int, num_kv_heads: int, head_dim: int,
                   tie_word_embeddings: bool, max_position_embeddings: int,
                   special_ids: tuple[int, int, int] = (BOS_ID, EOS_ID, PAD_ID)) -> dict[str, Any]:
    """A HF config.json dict for a model of `family`; `special_ids` are the tokenizer's (bos, eos, pad)
    (default: the char tokenizer's of models.tokenizer)."""
    if family not in FAMILIES:
        raise ValueError(f"unknown family {family!r}; supported: {FAMILIES}")
    if family == "qwen2" and head_dim * num_heads != hidden_size:
        # HF and vLLM Qwen2 derive head_dim from hidden_size; a free head_dim is not portable there.
        raise ValueError(f"qwen2 needs head_dim * num_heads == hidden_size, got {head_dim}*{num_heads}"
                         f" != {hidden_size}")
    config = {
        "architectures": [ARCHITECTURES[family]],
        "model_type": HF_MODEL_TYPES[family],
        "vocab_size": vocab_size,
        "hidden_size": hidden_size,
        "intermediate_size": intermediate_size,
        "num_hidden_layers": num_layers,
        "num_attention_heads": num_heads,
        "num_key_value_heads": num_kv_heads,
        "head_dim": head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": max_position_embeddings,
        "rms_norm_eps": 1e-6,
        "initializer_range": INIT_STD,
        "tie_word_embeddings": tie_word_embeddings,
        "attention_dropout": 0.0,
        "use_cache": True,
        "bos_token_id": special_ids[0],
        "eos_token_id": special_ids[1],
        "pad_token_id": special_ids[2],
        "torch_dtype": "float32",
        **_ROPE[family],
    }
    if family == "qwen2":
        config.update(use_sliding_window=False, sliding_window=None, max_window_layers=num_layers)
    else:
        config.update(attention_bias=False)
    if family == "llama3":
        config.update(mlp_bias=False, pretraining_tp=1,
                      rope_scaling=_llama3_rope_scaling(max_position_embeddings))
    return config


def random_weights(hf_config: dict[str, Any], seed: int = 0) -> dict[str, np.ndarray]:
    """GPT-2 style init: N(0, 0.02^2) everywhere, residual-output projections (o_proj, down_proj)
    scaled by 1/sqrt(2L), norm weights 1, biases N(0, 0.02^2) so the bias path is exercised.

    Drawn here because tunix zero-initialises MLP kernels (a "random" tunix model has a dead MLP).
    """
    rng = np.random.default_rng(seed)
    residual_std = INIT_STD / np.sqrt(2 * hf_config["num_hidden_layers"])
    weights = {}
    for name, shape in hf_param_shapes(hf_config).items():
        if "norm" in name:
            weights[name] = np.ones(shape, np.float32)
            continue
        std = residual_std if name.endswith(("o_proj.weight", "down_proj.weight")) else INIT_STD
        weights[name] = rng.normal(0.0, std, size=shape).astype(np.float32)
    return weights


def make_tiny_model(out_dir: Path, *, family: str = "qwen2", alphabet: str = DEFAULT_ALPHABET,
                    num_layers: int = 2, hidden_size: int = 128, intermediate_size: int = 256,
                    num_heads: int = 4, num_kv_heads: int = 2, head_dim: int = 32,
                    tie_word_embeddings: bool = False, max_position_embeddings: int = 256,
                    seed: int = 0) -> Path:
    """Write a complete HF model dir with random float32 weights and a char tokenizer; return it.

    vLLM's CPU attention needs head_dim in {32, 64, 80, 96, 112, 128, ...} (not 16). A (fsdp, tp)
    mesh needs hidden_size, intermediate_size divisible by fsdp and tp, vocab_size, num_kv_heads and
    head_dim divisible by tp. The defaults (~0.3M params) satisfy vLLM and an 8-device mesh.
    """
    out_dir = Path(out_dir)
    config = tiny_hf_config(
        family=family, vocab_size=vocab_size_for(alphabet), num_layers=num_layers,
        hidden_size=hidden_size, intermediate_size=intermediate_size, num_heads=num_heads,
        num_kv_heads=num_kv_heads, head_dim=head_dim, tie_word_embeddings=tie_word_embeddings,
        max_position_embeddings=max_position_embeddings)
    weights = random_weights(config, seed)  # validates the config before anything is written
    build_char_tokenizer(out_dir, alphabet)
    save_file(weights, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    (out_dir / "config.json").write_text(json.dumps(config, indent=2))
    generation = {"bos_token_id": BOS_ID, "eos_token_id": EOS_ID, "pad_token_id": PAD_ID}
    (out_dir / "generation_config.json").write_text(json.dumps(generation, indent=2))
    return out_dir


# Qwen2.5-0.5B(-Instruct)'s shape: 24 layers, width 896, MLP 4864, 14 query heads × 64, 2 KV heads,
# the 151,936-token vocabulary, tied embeddings (~494M parameters).
QWEN2_5_0_5B = dict(num_layers=24, hidden_size=896, intermediate_size=4864, num_heads=14, num_kv_heads=2,
                    head_dim=64, vocab_size=151_936, tie_word_embeddings=True, max_position_embeddings=32_768)
# Qwen2.5-1.5B's: 28 layers, width 1536, MLP 8960, 12 query heads × 128, 2 KV heads, tied (~1.54B parameters).
QWEN2_5_1_5B = dict(num_layers=28, hidden_size=1536, intermediate_size=8960, num_heads=12, num_kv_heads=2,
                    head_dim=128, vocab_size=151_936, tie_word_embeddings=True, max_position_embeddings=32_768)


def make_chatml_model(out_dir: Path, *, dtype: str = "bfloat16", seed: int = 0, **shape: Any) -> Path:
    """A Qwen2-family HF dir of a real model's shape (`QWEN2_5_0_5B` updated by `shape`, e.g. fewer
    layers) with random weights saved in `dtype` and an offline byte-level ChatML tokenizer whose ids
    span the whole vocabulary (models.tokenizer.build_chatml_tokenizer): what a user's checkpoint looks
    like to every loader, without a download."""
    import ml_dtypes

    dims = {**QWEN2_5_0_5B, **shape}  # e.g. **QWEN2_5_1_5B for that model's shape
    out_dir = Path(out_dir)
    config = tiny_hf_config(family="qwen2", **dims, special_ids=(CHATML_PAD_ID, IM_END_ID, CHATML_PAD_ID))
    config["torch_dtype"] = dtype
    target = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16}[dtype]
    weights = {name: array.astype(target) for name, array in random_weights(config, seed).items()}
    build_chatml_tokenizer(out_dir, vocab_size=dims["vocab_size"])
    save_file(weights, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    (out_dir / "config.json").write_text(json.dumps(config, indent=2))
    generation = {"bos_token_id": CHATML_PAD_ID, "eos_token_id": IM_END_ID, "pad_token_id": CHATML_PAD_ID}
    (out_dir / "generation_config.json").write_text(json.dumps(generation, indent=2))
    return out_dir

"""HF tensor names/shapes per family against what transformers itself saves, and config checks."""

import json

import pytest
import torch
from safetensors import safe_open
from transformers import AutoConfig, AutoModelForCausalLM

from models.families import check_supported, family_of, hf_param_shapes, rope_settings
from models.tiny import tiny_hf_config

SMALL = dict(vocab_size=48, num_layers=2, hidden_size=64, intermediate_size=96, num_heads=2, num_kv_heads=1,
             head_dim=32, max_position_embeddings=64)


def transformers_saved_shapes(hf_config: dict, tmp_path) -> dict[str, tuple[int, ...]]:
    """Names and shapes of the tensors transformers writes for this config (its save drops tied copies)."""
    (tmp_path / "config.json").write_text(json.dumps(hf_config))
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(tmp_path))
    model.save_pretrained(tmp_path / "saved")
    with safe_open(tmp_path / "saved" / "model.safetensors", framework="numpy") as f:
        return {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}


@pytest.mark.parametrize("family", ["qwen2", "qwen3", "llama3"])
@pytest.mark.parametrize("tied", [False, True])
def test_hf_param_shapes_equal_what_transformers_saves(family, tied, tmp_path):
    config = tiny_hf_config(family=family, tie_word_embeddings=tied, **SMALL)
    assert family_of(config) == family
    assert hf_param_shapes(config) == transformers_saved_shapes(config, tmp_path)


def test_rope_settings_read_both_config_spellings():
    assert rope_settings({"rope_theta": 5e5}) == (5e5, None)
    assert rope_settings({"rope_parameters": {"rope_type": "default", "rope_theta": 1e6}}) == (1e6, None)
    llama = {"rope_parameters": {"rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0}}
    theta, scaling = rope_settings(llama)
    assert theta == 5e5 and scaling == {"rope_type": "llama3", "factor": 8.0}


def test_unsupported_configs_get_clear_errors():
    with pytest.raises(ValueError, match="unsupported model_type 'gpt2'"):
        family_of({"model_type": "gpt2"})
    base = tiny_hf_config(family="llama3", tie_word_embeddings=False, **SMALL)
    for change, message in [({"mlp_bias": True}, "mlp_bias"), ({"hidden_act": "gelu"}, "hidden_act"),
                            ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "rope_type='yarn'"),
                            ({"attention_bias": True}, "attention_bias")]:
        with pytest.raises(ValueError, match=message):
            check_supported({**base, **change})
    with pytest.raises(ValueError, match="head_dim"):
        tiny_hf_config(family="qwen2", tie_word_embeddings=False, **{**SMALL, "head_dim": 16})

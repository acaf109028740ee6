"""The LoRA contract (models/peft.py): PEFT names and shapes per family, the config's checks, and what an
adapter version weighs against a full one at Qwen2.5-0.5B's shape."""

import numpy as np
import pytest

from models.families import hf_param_shapes
from models.peft import TARGETS, LoraConfig, adapter_config, adapter_shapes, peft_name
from models.tiny import QWEN2_5_0_5B, tiny_hf_config


def test_adapters_go_on_every_targeted_linear_layer_with_peft_names_and_shapes():
    config = tiny_hf_config(family="qwen3", vocab_size=40, num_layers=2, hidden_size=64, intermediate_size=96,
                            num_heads=4, num_kv_heads=2, head_dim=16, tie_word_embeddings=False,
                            max_position_embeddings=64)
    shapes = adapter_shapes(config, LoraConfig(rank=4, targets=("q_proj", "down_proj")))
    assert shapes == {
        "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight": (4, 64),
        "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight": (64, 4),
        "base_model.model.model.layers.0.mlp.down_proj.lora_A.weight": (4, 96),
        "base_model.model.model.layers.0.mlp.down_proj.lora_B.weight": (64, 4),
        "base_model.model.model.layers.1.self_attn.q_proj.lora_A.weight": (4, 64),
        "base_model.model.model.layers.1.self_attn.q_proj.lora_B.weight": (64, 4),
        "base_model.model.model.layers.1.mlp.down_proj.lora_A.weight": (4, 96),
        "base_model.model.model.layers.1.mlp.down_proj.lora_B.weight": (64, 4),
    }
    everything = adapter_shapes(config, LoraConfig(rank=4))
    assert len(everything) == 2 * 2 * len(TARGETS)  # no bias, norm or embedding gets one
    assert peft_name("model.layers.0.mlp.up_proj", "B") == "base_model.model.model.layers.0.mlp.up_proj.lora_B.weight"


def test_a_rank_8_adapter_version_weighs_under_2_percent_of_the_full_one_at_the_05b_shape():
    config = tiny_hf_config(family="qwen2", **QWEN2_5_0_5B)
    full = sum(np.prod(s) for s in hf_param_shapes(config).values())
    rank8 = sum(np.prod(s) for s in adapter_shapes(config, LoraConfig(rank=8)).values())
    rank64 = sum(np.prod(s) for s in adapter_shapes(config, LoraConfig(rank=64)).values())
    assert 490e6 < full < 500e6
    assert rank8 / full < 0.02 and rank8 / full == pytest.approx(0.0089, abs=0.0002)
    assert rank64 == 8 * rank8


def test_the_config_refuses_unknown_targets_and_states_its_scale():
    with pytest.raises(ValueError, match="subset of"):
        LoraConfig(targets=("q_proj", "lm_head"))
    with pytest.raises(ValueError, match="subset of"):
        LoraConfig(targets=())
    lora = LoraConfig(rank=8, alpha=32)
    assert lora.scale == 4.0
    peft = adapter_config(lora, "base/dir")
    assert (peft["r"], peft["lora_alpha"], peft["target_modules"], peft["peft_type"]) == (8, 32, list(TARGETS), "LORA")

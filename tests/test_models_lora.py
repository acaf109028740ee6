"""LoRA on the JAX families (models/lora.py, qwix) against independent oracles: at init the adapted model is
its base; with adapters set, its logits are transformers' over the weights merged by hand in numpy from the
exported PEFT tensors, and peft + transformers' over the exported PEFT dir; the merged HF export is that
numpy merge; adapters follow their kernels' shardings on a mesh."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from actors_helpers import hf_model, load_tensors, merged_weights, write_weights_dir
from flax import nnx
from jax.sharding import PartitionSpec as P

from models.jax_model import (
    export_adapter_tensors,
    export_hf_tensors,
    forward_logits,
    load_model,
    make_mesh,
    save_adapter_dir,
)
from models.lora import apply_lora
from models.peft import ADAPTER_CONFIG, LoraConfig, adapter_config, adapter_shapes
from models.tiny import make_tiny_model

LORA = LoraConfig(rank=4, alpha=8.0, targets=("q_proj", "v_proj", "o_proj", "gate_proj", "down_proj"))
FAMILIES = ("qwen2", "qwen3", "llama3")
IDS = np.array([[1, 3, 6, 15, 7, 4, 8, 9, 2, 12], [1, 3, 7, 7, 17, 8, 4, 10, 0, 0]], np.int32)
MASK = (IDS != 0).astype(np.int32)


@pytest.fixture(scope="module")
def tiny_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("lora")
    return {family: make_tiny_model(root / family, family=family, num_heads=8, num_kv_heads=8, head_dim=16,
                                    hidden_size=128) for family in FAMILIES}


def lora_model(hf_dir, mesh=None, lora: LoraConfig = LORA):
    with jax.set_mesh(mesh or make_mesh()):
        return apply_lora(load_model(hf_dir, mesh=mesh), lora, seed=3)


def randomise_adapters(loaded, seed: int = 0, std: float = 0.05) -> None:
    """Every A and B N(0, std²), in place (a trained adapter: B ≠ 0), keeping their shardings."""
    adapters = nnx.state(loaded.model, nnx.LoRAParam)
    keys = iter(jax.random.split(jax.random.key(seed), len(jax.tree.leaves(adapters))))
    nnx.update(loaded.model, jax.tree.map(
        lambda x: jax.device_put(std * jax.random.normal(next(keys), x.shape, x.dtype), x.sharding), adapters))


def logits(loaded) -> np.ndarray:
    return np.asarray(forward_logits(loaded.model, jnp.asarray(IDS), jnp.asarray(MASK)))


@pytest.mark.parametrize("family", FAMILIES)
def test_at_init_the_adapters_are_the_peft_shapes_with_b_zero_and_the_model_is_its_base(tiny_dirs, family):
    base = load_model(tiny_dirs[family])
    loaded = lora_model(tiny_dirs[family])
    adapters = dict(export_adapter_tensors(loaded))
    shapes = adapter_shapes(loaded.hf_config, LORA)
    assert list(adapters) == list(shapes) and {k: v.shape for k, v in adapters.items()} == shapes
    assert all(not v.any() for k, v in adapters.items() if k.endswith("lora_B.weight"))
    assert all(v.std() > 0.01 for k, v in adapters.items() if k.endswith("lora_A.weight"))
    np.testing.assert_array_equal(logits(loaded), logits(base))
    for (name, merged), (_, plain) in zip(export_hf_tensors(loaded), export_hf_tensors(base), strict=True):
        np.testing.assert_array_equal(merged, plain, err_msg=name)


@pytest.mark.parametrize("family", FAMILIES)
def test_adapted_logits_are_the_hand_merged_weights_and_peft_over_the_exported_dir(tiny_dirs, family, tmp_path):
    from peft import PeftModel

    hf_dir = tiny_dirs[family]
    loaded = lora_model(hf_dir)
    randomise_adapters(loaded)
    adapters = dict(export_adapter_tensors(loaded))
    by_hand = merged_weights(load_tensors(hf_dir), adapters, LORA.scale)
    ours = logits(loaded)
    ids, mask = torch.tensor(IDS, dtype=torch.long), torch.tensor(MASK)
    peft_dir = save_adapter_dir(loaded, tmp_path / "adapter")
    with torch.no_grad():
        plain = hf_model(hf_dir)(input_ids=ids, attention_mask=mask).logits.numpy()
        merged = hf_model(write_weights_dir(hf_dir, tmp_path / "merged", by_hand))(input_ids=ids,
                                                                                   attention_mask=mask).logits.numpy()
        peft = PeftModel.from_pretrained(hf_model(hf_dir), str(peft_dir)).eval()(input_ids=ids,
                                                                                attention_mask=mask).logits.numpy()
    real = MASK.astype(bool)
    assert np.abs(ours - plain)[real].max() > 0.05  # the adapters change the model
    np.testing.assert_allclose(ours[real], merged[real], atol=2e-5)
    np.testing.assert_allclose(ours[real], peft[real], atol=2e-5)
    for name, array in export_hf_tensors(loaded):  # the merged export is the numpy merge
        np.testing.assert_allclose(array, by_hand[name], atol=1e-6, err_msg=name)
    assert json.loads((peft_dir / ADAPTER_CONFIG).read_text()) == adapter_config(LORA, str(hf_dir.absolute()))


@pytest.mark.slow  # eager forwards over 8 devices
def test_adapters_take_their_kernels_shardings_and_a_mesh_gives_single_device_logits(tiny_dirs):
    hf_dir = tiny_dirs["qwen2"]
    single = lora_model(hf_dir)
    randomise_adapters(single)
    sharded = lora_model(hf_dir, make_mesh(fsdp=4, tp=2))
    nnx.update(sharded.model, jax.tree.map(lambda s, x: jax.device_put(x, s.sharding),
                                           nnx.state(sharded.model, nnx.LoRAParam),
                                           nnx.state(single.model, nnx.LoRAParam)))
    q = sharded.model.layers[0].attn.q_proj
    assert q.w_lora_a[...].sharding.spec == P("fsdp", None)  # kernel [embed (fsdp), heads (tp), head_dim]
    assert q.w_lora_b[...].sharding.spec == P(None, "tp", None)
    np.testing.assert_allclose(logits(sharded), logits(single), atol=2e-5)


def test_dropout_is_refused_and_lora_rides_no_model_without_it(tiny_dirs):
    with pytest.raises(ValueError, match="dropout"):
        lora_model(tiny_dirs["qwen2"], lora=LoraConfig(dropout=0.1))
    with pytest.raises(ValueError, match="no LoRA adapters"):
        list(export_adapter_tensors(load_model(tiny_dirs["qwen2"])))

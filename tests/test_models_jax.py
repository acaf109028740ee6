"""JAX families against independent oracles: transformers logits, bit-exact HF round trip, meshes."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx
from safetensors.numpy import load_file, save_file
from transformers import AutoModelForCausalLM

from models.attention import segment_mask
from models.families import hf_param_shapes
from models.jax_model import (
    export_hf_tensors,
    forward_hidden,
    forward_logits,
    load_model,
    make_mesh,
    positions_and_segments,
    save_hf_dir,
    unembed,
)
from models.tiny import make_tiny_model

CASES = [(family, tied) for family in ("qwen2", "qwen3", "llama3") for tied in (False, True)]
# Right-padded, left-padded and full rows (the forward must handle every layout).
IDS = np.array([[1, 3, 6, 15, 7, 4, 8, 9, 2, 12],
                [1, 3, 7, 7, 17, 8, 4, 10, 0, 0],
                [0, 0, 0, 1, 3, 9, 15, 9, 4, 11]], np.int32)
MASK = (IDS != 0).astype(np.int32)


def perturb_norms(hf_dir, seed=1):
    """Norm weights 1 + N(0, 0.1^2): with all-ones norms a swapped norm mapping would go unnoticed."""
    path = hf_dir / "model.safetensors"
    tensors = load_file(path)
    rng = np.random.default_rng(seed)
    for name in tensors:
        if "norm" in name:
            tensors[name] = (1 + 0.1 * rng.standard_normal(tensors[name].shape)).astype(np.float32)
    save_file(tensors, path, metadata={"format": "pt"})
    return hf_dir


@pytest.fixture(scope="module")
def tiny_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny")
    return {(f, t): perturb_norms(make_tiny_model(root / f"{f}-{t}", family=f, tie_word_embeddings=t))
            for f, t in CASES}


def transformers_logits(hf_dir, ids, mask):
    model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32)
    with torch.no_grad():
        return model(input_ids=torch.tensor(ids, dtype=torch.long),
                     attention_mask=torch.tensor(mask)).logits.numpy()


@pytest.mark.parametrize("family,tied", CASES)
def test_logits_match_transformers(tiny_dirs, family, tied):
    hf_dir = tiny_dirs[family, tied]
    ours = np.asarray(forward_logits(load_model(hf_dir).model, IDS, MASK))
    ref = transformers_logits(hf_dir, IDS, MASK)
    real = MASK.astype(bool)
    assert np.abs(ours - ref)[real].max() < 1e-5
    assert np.abs(ref[real]).max() > 0.1  # the comparison is not between near-zero logits


@pytest.mark.parametrize("family", ["qwen2", "llama3"])
def test_hidden_unembed_split_equals_tunix_call(tiny_dirs, family):
    """Our decoder-layer forward (segment ids, blockwise attention by default on CPU) against tunix's own
    `__call__` (its einsum attention under the dense mask): the same logits on every real token."""
    model = load_model(tiny_dirs[family, False]).model
    positions, segments = positions_and_segments(jnp.asarray(MASK))
    tunix_logits, _ = model(jnp.asarray(IDS), positions, None, segment_mask(segments))  # tunix's own __call__
    hidden = forward_hidden(model, IDS, MASK)
    real = MASK.astype(bool)
    np.testing.assert_allclose(np.asarray(unembed(model, hidden))[real], np.asarray(tunix_logits)[real], atol=1e-6)
    np.testing.assert_allclose(np.asarray(unembed(model, hidden[:, 3:7]))[real[:, 3:7]],
                               np.asarray(tunix_logits)[:, 3:7][real[:, 3:7]], atol=1e-6)


def test_padding_side_does_not_change_real_token_logits(tiny_dirs):
    model = load_model(tiny_dirs["llama3", False]).model
    row = IDS[0, :6]
    right = np.stack([np.concatenate([row, [0, 0]])])
    left = np.stack([np.concatenate([[0, 0], row])])
    out_right = np.asarray(forward_logits(model, right, (right != 0).astype(np.int32)))[0, :6]
    out_left = np.asarray(forward_logits(model, left, (left != 0).astype(np.int32)))[0, 2:]
    np.testing.assert_allclose(out_right, out_left, atol=1e-5)


@pytest.mark.parametrize("family,tied", CASES)
def test_hf_jax_hf_round_trip_is_bit_exact(tiny_dirs, family, tied):
    hf_dir = tiny_dirs[family, tied]
    original = load_file(hf_dir / "model.safetensors")
    loaded = load_model(hf_dir)
    exported = list(export_hf_tensors(loaded))
    names = [name for name, _ in exported]
    assert len(names) == len(set(names))
    assert set(names) == set(original) == set(hf_param_shapes(loaded.hf_config))
    for name, array in exported:
        assert array.dtype == original[name].dtype and array.flags.c_contiguous
        assert np.array_equal(array, original[name]), name


def test_bf16_round_trip_and_saved_dir_loads_in_transformers(tiny_dirs, tmp_path):
    hf_dir = tiny_dirs["qwen3", True]
    fp32 = load_model(hf_dir)
    bf16_dir = save_hf_dir(fp32, tmp_path / "bf16", tokenizer_dir=hf_dir, dtype="bfloat16")
    assert json.loads((bf16_dir / "config.json").read_text())["torch_dtype"] == "bfloat16"
    on_disk = load_file(bf16_dir / "model.safetensors")
    bf16 = load_model(bf16_dir, dtype="bfloat16")
    assert bf16.model.embedder.input_embedding[...].dtype == jnp.bfloat16
    for name, array in export_hf_tensors(bf16):
        assert str(array.dtype) == "bfloat16" and np.array_equal(array, on_disk[name]), name
    # Exporting the fp32 model as bf16 casts exactly like loading the fp32 file as bf16 does.
    for (name, a), (_, b) in zip(export_hf_tensors(fp32, "bfloat16"), export_hf_tensors(bf16), strict=True):
        assert np.array_equal(a, b), name

    fp32_dir = save_hf_dir(fp32, tmp_path / "fp32", tokenizer_dir=hf_dir)
    assert {p.name for p in fp32_dir.iterdir()} >= {"config.json", "model.safetensors", "tokenizer.json",
                                                    "tokenizer_config.json", "special_tokens_map.json"}
    ref = transformers_logits(fp32_dir, IDS, MASK)
    ours = np.asarray(forward_logits(fp32.model, IDS, MASK))
    assert np.abs(ours - ref)[MASK.astype(bool)].max() < 1e-5


@pytest.mark.parametrize("fsdp,tp", [(4, 2), (8, 1)])
@pytest.mark.parametrize("family", ["qwen2", "qwen3", "llama3"])
def test_sharded_mesh_gives_single_device_logits(tiny_dirs, family, fsdp, tp):
    hf_dir = tiny_dirs[family, family == "qwen3"]
    ids, mask = np.tile(IDS, (8, 1))[:8], np.tile(MASK, (8, 1))[:8]  # batch divisible by fsdp
    reference = np.asarray(forward_logits(load_model(hf_dir).model, ids, mask))
    mesh = make_mesh(fsdp, tp)
    loaded = load_model(hf_dir, mesh=mesh)
    q_kernel = loaded.model.layers[0].attn.q_proj.w[...]  # [embed, heads, head_dim]
    assert q_kernel.sharding.spec == jax.sharding.PartitionSpec("fsdp", "tp", None)
    assert q_kernel.addressable_shards[0].data.shape == (128 // fsdp, 4 // tp, 32)
    gate = loaded.model.layers[0].mlp.gate_proj.kernel[...]
    assert len({s.device for s in gate.addressable_shards}) == 8
    assert gate.addressable_shards[0].data.shape == (128 // fsdp, 256 // tp)
    with jax.set_mesh(mesh):
        sharded = nnx.jit(forward_logits)(loaded.model, jnp.asarray(ids), jnp.asarray(mask))
    np.testing.assert_allclose(np.asarray(sharded), reference, atol=1e-5)
    # Export gathers the shards back into the exact HF tensors.
    original = load_file(hf_dir / "model.safetensors")
    assert all(np.array_equal(a, original[n]) for n, a in export_hf_tensors(loaded))


def test_bad_checkpoints_fail_clearly(tiny_dirs, tmp_path):
    src = tiny_dirs["qwen2", False]
    broken = save_hf_dir(load_model(src), tmp_path / "broken", tokenizer_dir=src)
    tensors = load_file(broken / "model.safetensors")
    del tensors["model.layers.1.self_attn.k_proj.bias"]
    save_file(tensors, broken / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"missing \['model.layers.1.self_attn.k_proj.bias'\]"):
        load_model(broken)
    with pytest.raises(ValueError, match="dtype must be one of"):
        load_model(src, dtype="float16")
    with pytest.raises(FileNotFoundError, match="no config.json"):
        load_model(tmp_path)
    with pytest.raises(ValueError, match="needs 16 devices"):
        make_mesh(8, 2)


def test_stock_tunix_rope_is_untouched_outside_our_models():
    from tunix.models.llama3 import model as llama3_lib

    x = jax.random.normal(jax.random.key(0), (1, 5, 2, 8))
    pos = jnp.arange(5)[None]
    np.testing.assert_array_equal(llama3_lib.apply_rope(x, pos, head_dim=8),
                                  llama3_lib.apply_rope.tandem_wrapped(x, pos, head_dim=8))


def test_large_exports_are_sharded_with_an_index_and_stale_shards_removed(tiny_dirs, tmp_path, monkeypatch):
    import models.jax_model as jax_model

    src = tiny_dirs["llama3", False]
    loaded = load_model(src)
    monkeypatch.setattr(jax_model, "MAX_SHARD_BYTES", 300_000)
    out = save_hf_dir(loaded, tmp_path / "out", tokenizer_dir=src)
    shards = sorted(p.name for p in out.glob("*.safetensors"))
    assert len(shards) > 2 and shards[0] == f"model-00001-of-{len(shards):05d}.safetensors"
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"]) == set(hf_param_shapes(loaded.hf_config))
    original = load_file(src / "model.safetensors")
    assert all(np.array_equal(a, original[n]) for n, a in export_hf_tensors(load_model(out)))
    ref = transformers_logits(out, IDS, MASK)  # transformers follows the index
    assert np.abs(np.asarray(forward_logits(loaded.model, IDS, MASK)) - ref)[MASK.astype(bool)].max() < 1e-5

    monkeypatch.setattr(jax_model, "MAX_SHARD_BYTES", 1 << 30)
    save_hf_dir(loaded, out, tokenizer_dir=src)  # overwrite in place: one file, no leftovers
    assert sorted(p.name for p in out.glob("*.safetensors")) == ["model.safetensors"]
    assert not (out / "model.safetensors.index.json").exists()
    assert not [p for p in out.iterdir() if ".tmp-" in p.name]


@pytest.mark.parametrize("family", ["qwen2", "qwen3", "llama3"])
def test_blockwise_attention_gives_the_einsum_models_logits_and_gradients(tiny_dirs, family):
    graphdef, params, rest = nnx.split(load_model(tiny_dirs[family, True]).model, nnx.Param, ...)
    real = jnp.asarray(MASK.astype(bool))[..., None]
    weights = jax.random.normal(jax.random.key(0), (*IDS.shape, 48))  # the tiny vocabulary

    def loss(p, impl):
        model = nnx.merge(graphdef, p, rest)
        model.attention_impl = impl
        logits = forward_logits(model, IDS, MASK)
        return jnp.sum(jnp.where(real, logits, 0) * weights), logits

    (_, blockwise), grads = jax.value_and_grad(loss, has_aux=True)(params, "blockwise")
    (_, einsum), reference = jax.value_and_grad(loss, has_aux=True)(params, "xla")
    np.testing.assert_allclose(np.asarray(blockwise)[MASK.astype(bool)], np.asarray(einsum)[MASK.astype(bool)],
                               atol=1e-5)
    for got, want in zip(jax.tree.leaves(grads), jax.tree.leaves(reference), strict=True):
        # float32 rounding of gradients up to ~30 (weights summed over every position): 1e-5 of the largest
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-5 * float(jnp.abs(want).max()))


@pytest.mark.parametrize("impl", ["blockwise", "xla"])
def test_a_packed_row_gives_each_sequence_its_own_hidden_states(tiny_dirs, impl):
    """Two sequences in one row (positions restarting, segment ids 1 and 2, padding after) against each
    run alone: attention never crosses a segment, whatever the implementation."""
    model = load_model(tiny_dirs["qwen3", False]).model
    model.attention_impl = impl
    first, second = IDS[0], IDS[1, :8]
    packed = np.concatenate([first, second, [0, 0]])[None]
    positions = np.concatenate([np.arange(10), np.arange(8), [0, 0]])[None]
    segments = np.asarray([[1] * 10 + [2] * 8 + [0, 0]])
    hidden = np.asarray(model.hidden_states(jnp.asarray(packed), jnp.asarray(positions), jnp.asarray(segments)))[0]
    for sequence, span in ((first, slice(0, 10)), (second, slice(10, 18))):
        alone = np.asarray(forward_hidden(model, sequence[None], np.ones((1, len(sequence)), np.int32)))[0]
        np.testing.assert_allclose(hidden[span], alone, atol=1e-5)


def test_every_remat_policy_gives_the_same_gradients(tiny_dirs):
    """Remat changes what the backward pass keeps, not what it computes."""
    graphdef, params, rest = nnx.split(load_model(tiny_dirs["qwen2", False]).model, nnx.Param, ...)

    def loss(p, policy):
        model = nnx.merge(graphdef, p, rest)
        model.remat_policy = policy
        return jnp.sum(forward_logits(model, IDS, MASK)[MASK.astype(bool)] ** 2)

    reference = jax.grad(loss)(params, "none")
    for policy in ("full", "save_matmuls"):
        grads = jax.tree.leaves(jax.grad(loss)(params, policy))
        for got, want in zip(grads, jax.tree.leaves(reference), strict=True):
            np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-6 * float(jnp.abs(want).max()))

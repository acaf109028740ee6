"""A tiny random Qwen2 policy and a prompt/completion batch, for the learner-math tests.

The model is the project's tunix subclass (models.tunix_families), built from a tunix ModelConfig.

tunix zero-initialises MLP kernels, so the weights are re-drawn here (a zero MLP would hide bugs in
anything that flows through it). Prompts are left-padded, completions end in EOS then padding, the
layout tunix's `grpo_loss_fn` expects.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from tunix.models.qwen2 import model as qwen2

from models.tunix_families import MODEL_CLASSES

PAD_ID, EOS_ID = 0, 2


def is_norm_weight(leaf: jax.Array) -> bool:
    return leaf.ndim == 1 and bool(jnp.all(leaf == 1.0))


def tiny_qwen2(vocab_size: int = 48, *, tied: bool = False, seed: int = 0) -> nnx.Module:
    """2 layers, d=32, 4 heads × 8, 2 KV heads; every weight re-drawn N(0, 0.1²) (norms stay 1)."""
    config = qwen2.ModelConfig(
        num_layers=2, vocab_size=vocab_size, embed_dim=32, hidden_dim=64, num_heads=4, head_dim=8,
        num_kv_heads=2, rope_theta=10_000, norm_eps=1e-6, use_tied_embedding=tied,
    )
    # tunix annotates parameters with ("fsdp", "tp") shardings, so creating them needs a mesh.
    devices = np.array(jax.devices()[:1]).reshape(1, 1)
    mesh = jax.sharding.Mesh(devices, ("fsdp", "tp"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
    with jax.set_mesh(mesh):
        model = MODEL_CLASSES["qwen2"](config, rngs=nnx.Rngs(seed))
    params = nnx.state(model, nnx.Param)
    leaves, treedef = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.key(seed + 1), len(leaves))
    redrawn = [
        leaf if is_norm_weight(leaf) else 0.1 * jax.random.normal(k, leaf.shape, leaf.dtype)
        for leaf, k in zip(leaves, keys, strict=True)
    ]
    nnx.update(model, jax.tree.unflatten(treedef, redrawn))
    return model


@dataclasses.dataclass
class Batch:
    """Left-padded prompts [B, P] and completions [B, C] (EOS, then PAD) with their masks."""

    prompt_ids: np.ndarray
    prompt_mask: np.ndarray
    completion_ids: np.ndarray
    completion_mask: np.ndarray  # 1 up to and including EOS (tunix's make_completion_mask)

    @property
    def input_ids(self) -> np.ndarray:
        return np.concatenate([self.prompt_ids, self.completion_ids], axis=1)

    @property
    def attention_mask(self) -> np.ndarray:
        return np.concatenate([self.prompt_mask, self.completion_mask], axis=1)


def make_batch(batch: int, prompt_len: int, completion_len: int, vocab_size: int, seed: int = 0) -> Batch:
    """Random tokens (never PAD or EOS inside), random prompt and completion lengths."""
    rng = np.random.default_rng(seed)
    prompt_ids = rng.integers(3, vocab_size, (batch, prompt_len))
    completion_ids = rng.integers(3, vocab_size, (batch, completion_len))
    prompt_lens = rng.integers(1, prompt_len + 1, batch)
    completion_lens = rng.integers(1, completion_len + 1, batch)  # tokens including EOS
    completion_lens[0] = completion_len  # one completion fills the width (EOS at the end)
    pos_p, pos_c = np.arange(prompt_len)[None], np.arange(completion_len)[None]
    prompt_mask = pos_p >= prompt_len - prompt_lens[:, None]
    completion_mask = pos_c < completion_lens[:, None]
    prompt_ids = np.where(prompt_mask, prompt_ids, PAD_ID)
    completion_ids = np.where(pos_c == completion_lens[:, None] - 1, EOS_ID, completion_ids)
    completion_ids = np.where(completion_mask, completion_ids, PAD_ID)
    return Batch(
        prompt_ids.astype(np.int32), prompt_mask.astype(np.int32),
        completion_ids.astype(np.int32), completion_mask.astype(np.int32),
    )


def test_tiny_model_has_live_mlp_and_batch_layout():
    model = tiny_qwen2()
    assert float(jnp.abs(model.layers[0].mlp.down_proj.kernel.value).max()) > 0.01
    b = make_batch(4, 5, 6, 48, seed=3)
    assert (b.prompt_mask[:, -1] == 1).all()  # left padding: last prompt position is always real
    lens = b.completion_mask.sum(1)
    assert (b.completion_ids[np.arange(4), lens - 1] == EOS_ID).all()
    assert ((b.completion_ids == PAD_ID) == (b.completion_mask == 0)).all()

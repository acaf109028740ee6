"""Shared set-up of the learner training tests: a tiny HF model dir, small data sets and batches.

The model's head counts are multiples of 8 so it shards over fsdp=8 and fsdp=4 × tp=2 (tunix
shards attention heads over "fsdp"). 2 layers, d=64, vocab 48: ~88k parameters.
"""

from __future__ import annotations

from pathlib import Path

import jax
import numpy as np

from learner.algo.optim import OptimizerConfig
from learner.algo.rl_batch import RLBatch
from models.tiny import make_tiny_model

TINY = dict(num_layers=2, hidden_size=64, intermediate_size=128, num_heads=8, num_kv_heads=8, head_dim=8)

# Adam's first update is lr·g/(|g|+ε): a reordered sum can flip a near-zero gradient element, which
# moves that parameter by up to ~lr. A small lr keeps such flips inside the tolerance.
OPTIMIZER = OptimizerConfig(learning_rate=1e-4)
TOL = 1e-6


def tiny_model_dir(out_dir: Path, seed: int = 0) -> Path:
    return make_tiny_model(out_dir, seed=seed, **TINY)


def addition_chats(n: int, seed: int = 0) -> list[dict]:
    """Chat rows "a+b" → "a+b's sum" with 2-digit operands."""
    rng = np.random.default_rng(seed)
    rows = []
    for a, b in rng.integers(10, 100, size=(n, 2)):
        rows.append({"messages": [{"role": "user", "content": f"{a}+{b}"},
                                  {"role": "assistant", "content": str(a + b)}]})
    return rows


def addition_texts(n: int, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    return [{"text": f"{a}+{b}={a + b}"} for a, b in rng.integers(10, 100, size=(n, 2))]


def host_leaves(tree) -> list[np.ndarray]:
    """The arrays of a pytree (e.g. a trainer's state.params) on the host, in tree order."""
    return [np.asarray(x) for x in jax.tree.leaves(jax.device_get(tree))]


def max_abs_diff(a: list[np.ndarray], b: list[np.ndarray]) -> float:
    assert len(a) == len(b)
    return max(float(np.abs(x - y).max()) for x, y in zip(a, b, strict=True))


def random_rl_batch() -> RLBatch:
    """8 rows of random tokens: prompts of 8, completions of uneven length, random advantages."""
    rng = np.random.default_rng(0)
    rows, length = 8, 24
    ids = rng.integers(5, 40, (rows, length)).astype(np.int32)
    lengths = rng.integers(12, length + 1, rows)
    attention = (np.arange(length)[None] < lengths[:, None]).astype(np.int32)
    completion = attention * (np.arange(length)[None] >= 8)
    behaviour = np.where(completion > 0, rng.uniform(-4, -2, (rows, length)), 0)
    advantages = rng.normal(size=(rows, 1)) * completion  # one per completion, on its tokens
    positions = np.broadcast_to(np.arange(length, dtype=np.int32), (rows, length)) * attention
    return RLBatch(ids, attention, attention.copy(), positions.astype(np.int32), completion.astype(np.float32),
                   behaviour.astype(np.float32), advantages.astype(np.float32))

"""Mixed precision: float32 master weights with bf16 compute learn as float32 does; a pure bf16 learner
rounds most small updates away (the failure this mode exists for).

40 SFT steps on the demo's model shape (3 layers, d=128, weights ~N(0, 0.02²)) at constant learning
rates 1e-5 and 1e-6, from the same weights and the same batches, in three precisions:
  float32   param_dtype float32, compute float32 (the reference)
  mixed     param_dtype float32, compute bfloat16
  bf16      param_dtype bfloat16, compute bfloat16
The update is the change of the weights over the 40 steps (float64 on the host); the loss drop is
measured on one fixed batch by the same float32 evaluation for every run.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from learner_train_helpers import addition_chats
from transformers import AutoTokenizer

from launch.json_files import write_jsonl
from learner.algo.losses import normalizer_for
from learner.algo.optim import OptimizerConfig
from learner.algo.train_step import Trainer, cast_floating, masked_cross_entropy
from learner.data import DataConfig, make_batches
from models.jax_model import load_model, make_mesh
from models.tiny import make_tiny_model

DEMO_SHAPE = dict(num_layers=3, hidden_size=128, intermediate_size=384, num_heads=4, num_kv_heads=2, head_dim=32)
pytestmark = pytest.mark.slow  # 40 SFT steps in three precisions, twice

STEPS = 40
PRECISIONS = {"float32": ("float32", "float32"), "mixed": ("float32", "bfloat16"), "bf16": ("bfloat16", "bfloat16")}


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("mixed")
    model_dir = make_tiny_model(root / "model", seed=3, **DEMO_SHAPE)
    data = write_jsonl(root / "sft.jsonl", addition_chats(2000, seed=1))
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    batches = make_batches(DataConfig(kind="sft", source=str(data), seq_len=64, batch_size=16, seed=0), tokenizer)
    return model_dir, [next(batches) for _ in range(STEPS)]


def float32_loss(model_dir, batch):
    """params -> the float32 SFT loss on `batch` (the same evaluation for every precision)."""
    loaded = load_model(model_dir, mesh=make_mesh(1, 1))
    graphdef, _, rest = nnx.split(loaded.model, nnx.Param, ...)
    arrays = {k: jnp.asarray(v) for k, v in batch._asdict().items()}
    norm = normalizer_for(arrays["loss_mask"][:, 1:])

    @jax.jit
    def loss(params):
        model = nnx.merge(graphdef, cast_floating(params, jnp.float32), rest)
        return masked_cross_entropy(model, arrays, arrays["input_ids"][:, 1:], norm, None)[0]

    return loss


def train(model_dir, batches, precision: str, lr: float):
    """(weights before, weights after, the trainer) of STEPS sft steps in `precision`."""
    param_dtype, compute_dtype = PRECISIONS[precision]
    mesh = make_mesh(1, 1)
    trainer = Trainer(load_model(model_dir, mesh=mesh, dtype=param_dtype), mesh,
                      OptimizerConfig(learning_rate=lr, schedule="constant", max_grad_norm=None),
                      compute_dtype=compute_dtype)
    def params():  # in tunix's per-layer tree, as float32_loss's model takes them (the state is stacked)
        return jax.device_get(nnx.state(trainer.model, nnx.Param))

    before = jax.tree.map(lambda x: np.asarray(x, np.float64), params())
    for batch in batches:
        metrics = trainer.sft_step(batch)
        assert np.isfinite(metrics["loss"]) and not metrics["update_skipped"]
    return before, params(), trainer


def flat(tree) -> np.ndarray:
    return np.concatenate([np.asarray(x, np.float64).ravel() for x in jax.tree.leaves(tree)])


@pytest.mark.parametrize("lr", [1e-5, 1e-6])
def test_mixed_precision_update_matches_float32_and_pure_bf16_does_not(setup, lr):
    model_dir, batches = setup
    loss = float32_loss(model_dir, batches[0])
    runs = {name: train(model_dir, batches, name, lr) for name in PRECISIONS}
    start = flat(runs["float32"][0])
    reference = flat(runs["float32"][1]) - start
    initial_loss = float(loss(runs["float32"][0]))
    drops = {name: initial_loss - float(loss(after)) for name, (_, after, _) in runs.items()}
    cosines, changed = {}, {}
    for name, (_, after, _) in runs.items():
        update = flat(after) - start
        cosines[name] = float(update @ reference / (np.linalg.norm(update) * np.linalg.norm(reference)))
        changed[name] = float(np.mean(update != 0))
    print(f"lr {lr}: cosine to float32 {cosines}, loss drop {drops}, weights changed {changed}")
    assert drops["float32"] > 0
    assert cosines["mixed"] >= 0.9
    assert abs(drops["mixed"] - drops["float32"]) <= 0.2 * drops["float32"]
    assert changed["mixed"] > 0.9
    # The contrast: bf16 master weights lose much of the update (measured here: cosine 0.43 and 48 % of
    # float32's loss drop at lr 1e-5; cosine 0.03 and 4 % at 1e-6). Mixed: cosine 0.99994, drop ±0.01 %.
    assert cosines["bf16"] < 0.6 and drops["bf16"] < 0.6 * drops["float32"]


def test_mixed_precision_keeps_a_float32_master_and_exports_the_compute_dtype(setup):
    model_dir, batches = setup
    _, _, trainer = train(model_dir, batches[:1], "mixed", 1e-5)
    assert {x.dtype for x in jax.tree.leaves(trainer.state.params)} == {jnp.dtype(jnp.float32)}
    assert {x.dtype for x in jax.tree.leaves(trainer.state.opt_state) if hasattr(x, "dtype") and x.ndim} == {
        jnp.dtype(jnp.float32)}
    exported = dict(trainer.hf_tensors())
    assert {a.dtype.name for a in exported.values()} == {"bfloat16"}
    assert {a.dtype.name for a in dict(trainer.hf_tensors("float32")).values()} == {"float32"}

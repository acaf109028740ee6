"""LoRA on the learner (Trainer with a models.lora.apply_lora model): the train state is the adapters and
their AdamW moments alone, the base stays frozen in the compute dtype, the same steps run (rl with its KL
reference, sft, micro-batches), the merged HF export and the PEFT export give the learner's logprobs in
transformers and peft (float32: tight; bf16: within the repo's bf16 figure), and a run resumed from a
checkpoint over the base reloaded from its dir equals the uninterrupted run."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from actors_helpers import hf_model
from flax import nnx
from learner_train_helpers import (
    OPTIMIZER,
    TOL,
    addition_texts,
    host_leaves,
    max_abs_diff,
    random_rl_batch,
)
from transformers import AutoTokenizer

from launch.json_files import write_jsonl
from learner.algo.losses import LossConfig
from learner.algo.optim import OptimizerConfig
from learner.algo.train_step import Trainer
from learner.checkpoint import Checkpointer
from learner.data import DataConfig, make_batches
from learner.schema import TrainConfig
from models.jax_model import forward_logits, load_model, make_mesh, save_hf_dir
from models.lora import apply_lora
from models.peft import LoraConfig, adapter_shapes

LORA = LoraConfig(rank=4, alpha=8.0)
FAST = OptimizerConfig(learning_rate=1e-2, schedule="constant", warmup_steps=0)  # moves B well off zero
# The repo's bf16 figure: vLLM's and the learner's bf16 logprobs of the same tokens differ by 0.005 nats per
# token at Qwen2.5-0.5B's shape (README, tests/test_real_shape.py)
BF16_GAP = 0.005


def lora_trainer(hf_dir, *, compute: str = "float32", seed: int = 0, optimizer=FAST, mesh=(1, 1),
                 remat: str = TrainConfig().remat, **kwargs) -> Trainer:
    """A Trainer of LORA on `hf_dir`'s base (loaded in the compute dtype), adapters in float32, on a
    `mesh` = (fsdp, tp) mesh, each layer rematerialised as the config's default says."""
    mesh = make_mesh(*mesh)
    with jax.set_mesh(mesh):
        loaded = apply_lora(load_model(hf_dir, mesh=mesh, dtype=compute), LORA, seed=seed)
    return Trainer(loaded, mesh, optimizer, compute_dtype=compute, seed=seed, remat=remat, **kwargs)


def base_weights(trainer: Trainer) -> dict[str, np.ndarray]:
    params = nnx.to_flat_state(nnx.state(trainer.model, nnx.Param))
    return {".".join(map(str, path)): np.asarray(v.get_value()) for path, v in params
            if not isinstance(v, nnx.LoRAParam)}


def token_logprobs(logits: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """log p(ids[:, t+1] | ids[:, ≤t]) in float64."""
    logits = logits[:, :-1].astype(np.float64)
    logp = logits - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1, keepdims=True)) - logits.max(
        -1, keepdims=True)
    return np.take_along_axis(logp, ids[:, 1:, None], axis=-1)[..., 0]


def learner_logprobs(trainer: Trainer, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
    with jax.set_mesh(trainer.mesh):
        logits = forward_logits(trainer.model, jnp.asarray(ids), jnp.asarray(mask))
    return token_logprobs(np.asarray(logits.astype(jnp.float32)), ids)


@torch.no_grad()
def torch_logprobs(model, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
    logits = model(input_ids=torch.tensor(ids, dtype=torch.long), attention_mask=torch.tensor(mask)).logits
    return token_logprobs(logits.float().numpy(), ids)


def test_the_state_is_the_adapters_alone_and_the_base_stays_frozen_in_the_compute_dtype(hf_dir, tmp_path):
    trainer = lora_trainer(hf_dir, compute="bfloat16", loss=LossConfig(beta=0.1))
    shapes = adapter_shapes(trainer.loaded.hf_config, LORA)
    adapter_params = sum(int(np.prod(s)) for s in shapes.values())
    params = jax.tree.leaves(trainer.state.params)
    # A and B of 7 projections in each of 2 layers, stored stacked over the layers (models.stacked_layers)
    assert len(shapes) == 2 * 7 * 2 and len(params) == 7 * 2 and {p.shape[0] for p in params} == {2}
    assert {p.dtype for p in params} == {jnp.dtype("float32")}
    assert sum(p.nbytes for p in params) == 4 * adapter_params
    moments = [x for x in jax.tree.leaves(trainer.state.opt_state) if jnp.issubdtype(x.dtype, jnp.floating)]
    assert sum(m.nbytes for m in moments) == 2 * 4 * adapter_params  # AdamW's m and v, float32
    base = base_weights(trainer)
    assert {a.dtype for a in base.values()} == {jnp.dtype("bfloat16")}
    on_file = load_model(hf_dir, dtype="bfloat16")  # the base as loaded, cast once
    for name, value in nnx.to_flat_state(nnx.state(on_file.model, nnx.Param)):
        np.testing.assert_array_equal(base[".".join(map(str, name))], np.asarray(value.get_value()))

    batch = random_rl_batch()
    first, second = trainer.rl_step(batch), trainer.rl_step(batch)
    assert first["kl"] == 0 and second["kl"] > 0  # the KL reference is the initial adapters: the base itself
    texts = make_batches(DataConfig(kind="pretrain", source=str(write_jsonl(tmp_path / "t.jsonl", addition_texts(64))),
                                    seq_len=32, batch_size=8), AutoTokenizer.from_pretrained(hf_dir))
    assert not trainer.pretrain_step(next(texts))["update_skipped"]
    after = base_weights(trainer)
    assert all(np.array_equal(after[k], base[k]) for k in base)
    adapters = dict(trainer.adapter_tensors())
    assert list(adapters) == list(shapes) and {a.dtype for a in adapters.values()} == {jnp.dtype("bfloat16")}
    assert min(np.abs(b).max() for name, b in adapters.items() if name.endswith("lora_B.weight")) > 0
    with pytest.raises(ValueError, match="float32_logits"):
        Trainer(trainer.loaded, trainer.mesh, FAST, compute_dtype="bfloat16", float32_logits=True)


@pytest.mark.slow  # two more compilations on 8 devices
def test_micro_batches_on_a_mesh_give_the_one_batch_update(hf_dir):
    batch = random_rl_batch()
    after = []
    for micro in (1, 2):
        trainer = lora_trainer(hf_dir, optimizer=OPTIMIZER, micro_batches=micro, mesh=(4, 2))
        trainer.rl_step(batch)
        after.append(host_leaves(trainer.state.params))
    assert max_abs_diff(*after) < TOL


def test_after_updates_the_merged_and_the_peft_exports_give_the_learners_logprobs(hf_dir, tmp_path):
    from peft import PeftModel

    trainer = lora_trainer(hf_dir)
    batch = random_rl_batch()
    before = learner_logprobs(trainer, batch.input_ids, batch.attention_mask)
    for _ in range(3):
        trainer.rl_step(batch)
    ids, mask = batch.input_ids, batch.attention_mask
    ours = learner_logprobs(trainer, ids, mask)
    real = mask[:, 1:].astype(bool)
    assert np.abs(ours - before)[real].mean() > 0.01  # the adapters moved the policy
    merged_dir = trainer.export_hf(tmp_path / "hf_final", tokenizer_dir=hf_dir)
    adapter_dir = trainer.export_adapter(tmp_path / "adapter_final")
    merged = torch_logprobs(hf_model(merged_dir), ids, mask)
    peft = torch_logprobs(PeftModel.from_pretrained(hf_model(hf_dir), str(adapter_dir)).eval(), ids, mask)
    reloaded = token_logprobs(np.asarray(forward_logits(load_model(merged_dir).model, jnp.asarray(ids),
                                                        jnp.asarray(mask))), ids)
    for other in (merged, peft, reloaded):
        np.testing.assert_allclose(other[real], ours[real], atol=2e-5)


@pytest.mark.slow  # bf16 steps, peft and transformers
def test_bf16_exports_give_the_learners_logprobs_within_the_bf16_figure(hf_dir, tmp_path):
    from peft import PeftModel

    base_dir = save_hf_dir(load_model(hf_dir), tmp_path / "bf16-base", tokenizer_dir=hf_dir, dtype="bfloat16")
    trainer = lora_trainer(base_dir, compute="bfloat16")
    batch = random_rl_batch()
    for _ in range(3):
        trainer.rl_step(batch)
    ids, mask = batch.input_ids, batch.attention_mask
    real = mask[:, 1:].astype(bool)
    ours = learner_logprobs(trainer, ids, mask)
    merged = torch_logprobs(hf_model(trainer.export_hf(tmp_path / "hf_final", tokenizer_dir=base_dir)), ids, mask)
    peft_model = PeftModel.from_pretrained(hf_model(base_dir), str(trainer.export_adapter(tmp_path / "adapter")))
    peft = torch_logprobs(peft_model.eval(), ids, mask)
    gaps = {name: float(np.abs(other - ours)[real].mean()) for name, other in (("merged", merged), ("peft", peft))}
    print(f"\nbf16 learner vs its float32-evaluated exports, token-mean |Δ logprob|: {gaps}")
    assert max(gaps.values()) <= BF16_GAP, gaps


def test_a_resumed_lora_run_equals_the_uninterrupted_run(hf_dir, tmp_path):
    batch = random_rl_batch()
    straight = lora_trainer(hf_dir)
    for _ in range(3):
        straight.rl_step(batch)

    first = lora_trainer(hf_dir)
    checkpointer = Checkpointer(tmp_path / "checkpoints")
    for step in (1, 2):
        first.rl_step(batch)
        checkpointer.save(step, first.state)
    checkpointer.wait()
    # a new process: the base reloaded from its dir, adapters initialised from another seed, then restored
    resumed = lora_trainer(hf_dir, seed=7)
    restored = checkpointer.restore(resumed.state)
    checkpointer.close()
    assert restored.step == 2 and len(jax.tree.leaves(restored.state.params)) == 7 * 2  # adapters only
    resumed.state = restored.state
    resumed.rl_step(batch)
    assert max_abs_diff(host_leaves(resumed.state), host_leaves(straight.state)) == 0
    for (name, a), (_, b) in zip(resumed.hf_tensors(), straight.hf_tensors(), strict=True):
        np.testing.assert_array_equal(a, b, err_msg=name)

"""The learner's trainer for a run: its model on the device mesh (with its LoRA adapters when model.lora is
set), the optimizer and the loss."""

from __future__ import annotations

from pathlib import Path

import jax

from launch.run import Run
from learner.algo.train_step import Trainer
from learner.mesh import make_learner_mesh
from models.jax_model import load_model
from models.lora import apply_lora


def build_trainer(run: Run, *, temperature: float = 1.0) -> Trainer:
    """A Trainer ready for steps (`temperature`: the rollouts' sampling temperature, for RL logprobs).

    With model.lora the base loads straight in the compute dtype (model.dtype), frozen, and the adapters
    are created in model.param_dtype, their master dtype; else every weight loads in model.param_dtype."""
    config = run.config
    mesh = make_learner_mesh(config.mesh)
    lora = config.model.lora
    dtype = config.model.param_dtype if lora is None else config.model.dtype
    loaded = load_model(run.model_dir, mesh=mesh, dtype=dtype)
    if lora is not None:
        with jax.set_mesh(mesh):
            loaded = apply_lora(loaded, lora, dtype=config.model.param_dtype, seed=config.seed)
    return Trainer(loaded, mesh, config.optim, loss=config.algo, micro_batches=config.train.micro_batches,
                   micro_batch_tokens=config.train.micro_batch_tokens,
                   temperature=temperature, chunk_tokens=config.train.logits_chunk_tokens,
                   compute_dtype=config.model.dtype, remat=config.train.remat,
                   attention=config.train.attention, float32_logits=config.train.float32_logits, seed=config.seed,
                   skip_no_signal=config.train.skip_no_signal, memory_budget_gib=config.train.memory_budget_gib,
                   scan_layers=config.train.scan_layers)


def export_final(run: Run, trainer: Trainer) -> dict[str, Path]:
    """The run's final exports: hf_final/ (a HF dir; with LoRA the merged weights) and, with LoRA,
    adapter_final/ (the PEFT dir over model.path). Multi-host: every process calls it, process 0 writes."""
    out = {"hf_final": trainer.export_hf(run.run_dir / "hf_final", tokenizer_dir=run.model_dir)}
    if trainer.lora is not None:
        out["adapter_final"] = trainer.export_adapter(run.run_dir / "adapter_final")
    return out

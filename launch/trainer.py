"""The learner's trainer for a run: its model on the device mesh, the optimizer and the loss."""

from __future__ import annotations

from launch.run import Run
from learner.algo.train_step import Trainer
from learner.mesh import make_learner_mesh
from models.jax_model import load_model


def build_trainer(run: Run, *, temperature: float = 1.0) -> Trainer:
    """A Trainer ready for steps (`temperature`: the rollouts' sampling temperature, for RL logprobs)."""
    config = run.config
    mesh = make_learner_mesh(config.mesh)
    loaded = load_model(run.model_dir, mesh=mesh, dtype=config.model.param_dtype)
    return Trainer(loaded, mesh, config.optim, loss=config.algo, micro_batches=config.train.micro_batches,
                   micro_batch_tokens=config.train.micro_batch_tokens,
                   temperature=temperature, chunk_tokens=config.train.logits_chunk_tokens,
                   compute_dtype=config.model.dtype, remat=config.train.remat,
                   attention=config.train.attention, float32_logits=config.train.float32_logits, seed=config.seed,
                   skip_no_signal=config.train.skip_no_signal)

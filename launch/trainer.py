"""The learner's trainer for a run: its model on the device mesh, the optimizer and the loss."""

from __future__ import annotations

from launch.run import Run
from learner.mesh import make_learner_mesh
from learner.train_step import Trainer
from models.jax_model import load_model


def build_trainer(run: Run, *, temperature: float = 1.0) -> Trainer:
    """A Trainer ready for steps (`temperature`: the rollouts' sampling temperature, for RL logprobs)."""
    config = run.config
    mesh = make_learner_mesh(config.mesh)
    loaded = load_model(run.model_dir, mesh=mesh, dtype=config.model.dtype)
    return Trainer(loaded, mesh, config.optim, loss=config.algo, micro_batches=config.train.micro_batches,
                   temperature=temperature, chunk_size=config.train.logprob_chunk, seed=config.seed,
                   skip_no_signal=config.train.skip_no_signal)

"""The learner alone (pretrain, sft): no actors, no reward workers; a held-out evaluation at the end."""

from __future__ import annotations

from contextlib import closing, nullcontext
from typing import Any

from transformers import AutoTokenizer

from launch.console import Progress
from launch.evaluation import evaluate_dir
from launch.plots import plot_run
from launch.run import Mode, Run
from launch.trainer import build_trainer
from learner.chat_format import ChatFormat
from learner.checkpoint import Checkpointer
from learner.data import DataConfig, make_batches
from learner.mesh import is_leader
from learner.metrics import MetricsWriter
from learner.supervised_loop import run_supervised


def run_supervised_mode(run: Run, mode: Mode) -> dict[str, Any]:
    """Train `train.steps` steps (resuming from the newest checkpoint), export hf_final, evaluate it;
    returns the summary."""
    config = run.config
    tokenizer = AutoTokenizer.from_pretrained(run.model_dir)
    trainer = build_trainer(run)
    batches = make_batches(DataConfig(kind=mode, source=run.train_data, split=config.data.split,
                                      seq_len=config.data.seq_len, batch_size=config.train.batch_size,
                                      seed=config.seed,
                                      **config.data.model_dump(include=set(ChatFormat.model_fields))), tokenizer)
    checkpointer = Checkpointer(run.run_dir / "checkpoints", max_to_keep=config.train.keep_checkpoints,
                                save_every=config.train.checkpoint_every)
    leader = is_leader()  # multi-host: every process trains on the same global batch, process 0 reports
    with (closing(checkpointer), MetricsWriter(run.run_dir / "tb") if leader else nullcontext() as writer,
          Progress(mode, config.train.steps) if leader else nullcontext() as progress):
        run_supervised(trainer, batches, checkpointer, writer, steps=config.train.steps, on_step=progress)
    hf_dir = trainer.export_hf(run.run_dir / "hf_final", tokenizer_dir=run.model_dir)
    summary: dict[str, Any] = {"mode": mode, "steps": config.train.steps, "hf_final": str(hf_dir)}
    if not leader:
        return summary
    if (scores := evaluate_dir(run, tokenizer, hf_dir)) is not None:
        summary["eval"] = scores
    run.write_summary(summary)
    plot_run(run.run_dir, title=f"{mode}: {run.run_dir.name}")
    return summary

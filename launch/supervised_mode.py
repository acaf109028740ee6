"""The learner alone (pretrain, sft): no actors, no reward workers; a held-out evaluation at the end, and
every train.eval_every steps, where train.handoff exports the start it chooses for the next stage."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import ExitStack, closing, nullcontext
from pathlib import Path
from typing import Any

from transformers import AutoTokenizer

from launch.console import Progress
from launch.evaluation import evaluate_dir, make_evaluator, periodic_evals
from launch.plots import plot_run
from launch.run import Mode, Run
from launch.tracking import metrics_writer, report_end
from launch.trainer import build_trainer, export_final
from learner.algo.train_step import Trainer
from learner.chat_format import ChatFormat
from learner.checkpoint import Checkpointer
from learner.data import DataConfig, make_batches
from learner.mesh import is_leader
from learner.metrics import MetricsWriter
from learner.supervised_loop import run_supervised


def run_supervised_mode(run: Run, mode: Mode) -> dict[str, Any]:
    """Train `train.steps` steps (resuming from the newest checkpoint), export hf_final (and adapter_final with
    LoRA), evaluate hf_final; returns the summary (with train.eval_every: every evaluation; with
    train.handoff: the step chosen). Multi-host, every process trains on the same global batch and
    process 0 reports (metrics, trackers, evaluation, summary.json)."""
    with metrics_writer(run) if is_leader() else nullcontext() as writer:
        summary = train_supervised(run, mode, writer)
        if writer is not None:  # the trackers get the final evaluation and curves.png
            curves = plot_run(run.run_dir, title=f"{mode}: {run.run_dir.name}")
            report_end(writer, run.config.train.steps, summary, curves)
    return summary


def train_supervised(run: Run, mode: Mode, writer: MetricsWriter | None) -> dict[str, Any]:
    """run_supervised_mode's training, exports and evaluation; `writer` is None on processes other than 0."""
    config = run.config
    tokenizer = AutoTokenizer.from_pretrained(run.model_dir)
    trainer = build_trainer(run)
    batches = make_batches(DataConfig(kind=mode, source=run.train_data, split=config.data.split,
                                      seq_len=config.data.seq_len, batch_size=config.train.batch_size,
                                      seed=config.seed,
                                      **config.data.model_dump(include=set(ChatFormat.model_fields))), tokenizer)
    checkpointer = Checkpointer(run.run_dir / "checkpoints", max_to_keep=config.train.keep_checkpoints,
                                save_every=config.train.checkpoint_every)
    leader = writer is not None
    evals: dict[int, dict[str, float]] = {}
    with ExitStack() as stack:
        stack.enter_context(closing(checkpointer))
        progress = stack.enter_context(Progress(mode, config.train.steps) if leader else nullcontext())
        evaluator = make_evaluator(run, tokenizer, run.model_dir) if config.train.eval_every and leader else None
        if evaluator is not None:
            stack.callback(evaluator.close)
        evaluate = periodic_evals(run, mode, evaluator, trainer.hf_tensors, evals, handoff_exports(run, trainer))

        def on_step(step: int, metrics: dict[str, float]) -> None:
            evaluate(step, metrics)
            if progress is not None:
                progress(step, metrics)

        run_supervised(trainer, batches, checkpointer, writer, steps=config.train.steps, on_step=on_step)
    exports = export_final(run, trainer)
    hf_dir = exports["hf_final"]
    summary: dict[str, Any] = {"mode": mode, "steps": config.train.steps, **{k: str(v) for k, v in exports.items()}}
    if not leader:
        return summary
    if evals:
        summary["evals"] = evals
    if config.train.handoff is not None:
        summary["handoff"] = handoff_summary(run, evals)
    if (scores := evaluate_dir(run, tokenizer, hf_dir)) is not None:
        summary["eval"] = scores
    run.write_summary(summary)
    return summary


def handoff_exports(run: Run, trainer: Trainer) -> Callable[[int, dict[str, float]], None]:
    """With train.handoff: export hf_selected/ whenever an evaluation meets its rule (so it ends at the last
    such step, which it names in a `step` file)."""
    train = run.config.train

    def export_selected(step: int, scores: dict[str, float]) -> None:
        if train.handoff is not None and train.handoff.holds(scores, train.eval_k):
            trainer.export_hf(selected_dir(run), tokenizer_dir=run.model_dir)
            (selected_dir(run) / "step").write_text(str(step))

    return export_selected


def selected_dir(run: Run) -> Path:
    return run.run_dir / "hf_selected"


def handoff_summary(run: Run, evals: dict[int, dict[str, float]]) -> dict[str, Any]:
    """The step train.handoff chose (the last evaluated one meeting its rule, as hf_selected/ names it; None:
    no step did), its scores, and the rule; `hf_selected` is the dir to start the next stage from."""
    marker = selected_dir(run) / "step"
    step = int(marker.read_text()) if marker.is_file() else None
    return {"rule": run.config.train.handoff.model_dump(), "step": step, "eval": evals.get(step),
            "hf_selected": str(selected_dir(run)) if step is not None else None}

"""A run's metrics writer with the experiment trackers its `logging` section turns on (W&B, trackio), and
what a run, and the demo, hand them at the end: the final evaluation and the pictures.

Only the process that reports a run opens one (multi-host: process 0; launch/rl_mode.py and
launch/supervised_mode.py), so a multi-host learner logs once.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from launch.config import TandemConfig
from launch.run import Run
from learner.metrics import MetricsWriter
from learner.tracking.config import LoggingConfig, open_trackers

FINAL_EVAL_PREFIX = "eval_final/"  # hf_final's held-out scores (summary.json's `eval`), beside the loop's eval/


def tracked_config(config: TandemConfig) -> dict[str, Any]:
    """The resolved config a tracker logs once: every key, the auth token left out (trackers are shared)."""
    return config.model_dump(mode="json", exclude={"server": {"auth_token"}})


def metrics_writer(run: Run) -> MetricsWriter:
    """run_dir/tb's writer, fanned out to the run's trackers (each named after run_dir unless configured)."""
    trackers = open_trackers(run.config.logging, name=run.run_dir.name, config=tracked_config(run.config),
                             run_dir=run.run_dir)
    return MetricsWriter(run.run_dir / "tb", trackers=trackers)


def report_end(writer: MetricsWriter, step: int, summary: Mapping[str, Any], curves: Path) -> None:
    """The trackers get the final evaluation of hf_final (as eval_final/<score>) and curves.png at `step`."""
    scores = {FINAL_EVAL_PREFIX + name: float(value) for name, value in (summary.get("eval") or {}).items()}
    writer.report(step, scores, {"curves": curves})


def report_demo(logging: LoggingConfig, run_dir: Path, results: Mapping[str, Mapping[str, float]],
                figure: Path) -> None:
    """The demo's own tracker run (named after its run dir): each stage's held-out scores as
    <stage>/<score> and demo.png. Its stages are runs of their own."""
    trackers = open_trackers(logging, name=run_dir.name, config={"stages": list(results)}, run_dir=run_dir)
    scores = {f"{stage}/{name}": float(value) for stage, values in results.items() for name, value in values.items()}
    for tracker in trackers:
        tracker.log(0, scores)
        tracker.image(0, "demo", figure)
        tracker.close()

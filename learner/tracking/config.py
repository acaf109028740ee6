"""The `logging` section: which experiment trackers a run logs to beside TensorBoard and metrics.jsonl
(always written), and opening them, each on its own thread (learner.tracking.tracker)."""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial
from pathlib import Path
from typing import Any

from pydantic import Field

from learner.schema import Section
from learner.tracking.tracker import BackgroundTracker
from learner.tracking.trackio_tracker import TrackioSettings, TrackioTracker
from learner.tracking.wandb_tracker import WandbSettings, WandbTracker


class LoggingConfig(Section):
    """Experiment trackers beside TensorBoard: each optional (`pip install -e .[trackers]`), off by default,
    and failing soft (one that cannot start or breaks logs a warning and the run goes on without it)."""

    wandb: WandbSettings = Field(WandbSettings(), description=WandbSettings.__doc__)
    trackio: TrackioSettings = Field(TrackioSettings(), description=TrackioSettings.__doc__)


def open_trackers(logging: LoggingConfig, *, name: str, config: Mapping[str, Any],
                  run_dir: Path) -> list[BackgroundTracker]:
    """The trackers `logging` turns on, each starting on its own thread (the caller does not wait for it):
    a run called `name` (unless the section names it) with `config` logged once."""
    trackers = []
    if logging.wandb.mode != "disabled":
        trackers.append(BackgroundTracker("wandb", partial(WandbTracker.start, logging.wandb, name=name,
                                                           config=config, run_dir=run_dir)))
    if logging.trackio.enabled:
        trackers.append(BackgroundTracker("trackio", partial(TrackioTracker.start, logging.trackio, name=name,
                                                             config=config)))
    return trackers

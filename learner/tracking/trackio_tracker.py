"""trackio (`logging.trackio`): Hugging Face's local-first tracker; the run's scalars under TensorBoard's
names, its resolved config once, its pictures, in trackio's local store ($TRACKIO_DIR, default
$HF_HOME/trackio; `trackio show` opens its dashboard). Install with `pip install trackio`."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import Field

from learner.schema import Section


class TrackioSettings(Section):
    """Where a run is logged in trackio's local store (off unless `enabled`)."""

    enabled: bool = Field(False, description="log the run to trackio's local store ($TRACKIO_DIR, default "
                                             "$HF_HOME/trackio)")
    project: str = Field("tandem", min_length=1, description="trackio project")
    name: str | None = Field(None, description="run name (default: run_dir's last component)")
    group: str | None = Field(None, description="trackio group, e.g. one for the demo's stages")


class TrackioTracker:
    """A started trackio run (`start` makes one; call it on the tracker's own thread)."""

    def __init__(self, run: Any):
        self._run = run

    @classmethod
    def start(cls, settings: TrackioSettings, *, name: str, config: Mapping[str, Any]) -> TrackioTracker:
        import trackio

        # embed=False: no dashboard server; auto_log_*: no system-metrics threads of trackio's own
        return cls(trackio.init(project=settings.project, name=settings.name or name, group=settings.group,
                                config=dict(config), embed=False, auto_log_cpu=False, auto_log_gpu=False))

    def log(self, step: int, scalars: Mapping[str, float]) -> None:
        self._run.log(dict(scalars), step=step)

    def image(self, step: int, name: str, path: Path) -> None:
        import trackio

        self._run.log({name: trackio.Image(str(path))}, step=step)

    def close(self) -> None:
        self._run.finish()

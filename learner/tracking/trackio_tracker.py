"""trackio (`logging.trackio`): Hugging Face's local-first tracker; the run's scalars under TensorBoard's
names, its resolved config once, its pictures, in trackio's local store ($TRACKIO_DIR, default
$HF_HOME/trackio; `trackio show` opens its dashboard). trackio needs pillow<13, the stack pins 13: `make
trackio-env` installs it beside the venv in .trackio-site/, for PYTHONPATH=.trackio-site:. (docs/tracking.md)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import Field

from learner.schema import Section
from learner.tracking.tracker import ClientRun


class TrackioSettings(Section):
    """Where a run is logged in trackio's local store (off unless `enabled`)."""

    enabled: bool = Field(False, description="log the run to trackio's local store ($TRACKIO_DIR, default "
                                             "$HF_HOME/trackio)")
    project: str = Field("tandem", min_length=1, description="trackio project")
    name: str | None = Field(None, description="run name (default: run_dir's last component)")
    group: str | None = Field(None, description="trackio group, e.g. one for the demo's stages")


class TrackioTracker(ClientRun):
    """A started trackio run (`start` makes one; call it on the tracker's own thread)."""

    @classmethod
    def start(cls, settings: TrackioSettings, *, name: str, config: Mapping[str, Any]) -> TrackioTracker:
        import trackio

        # embed=False: no dashboard server; auto_log_*: no system-metrics threads of trackio's own
        return cls(trackio.init(project=settings.project, name=settings.name or name, group=settings.group,
                                config=dict(config), embed=False, auto_log_cpu=False, auto_log_gpu=False),
                   trackio.Image)

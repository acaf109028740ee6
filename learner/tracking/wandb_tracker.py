"""Weights & Biases (`logging.wandb`): the run's scalars under TensorBoard's names, its resolved config
once, its pictures. Install with `pip install -e .[trackers]`; `mode: offline` writes the run under
`dir` (default run_dir) for `wandb sync` later, with no network."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from learner.schema import Section
from learner.tracking.tracker import ClientRun


class WandbSettings(Section):
    """Where and how a run is logged to Weights & Biases (off unless `mode` says otherwise)."""

    mode: Literal["disabled", "offline", "online"] = Field(
        "disabled", description="disabled: no W&B; offline: write the run under `dir` for `wandb sync` (no "
                                "network); online: send it to the W&B server (WANDB_API_KEY or `wandb login`)")
    project: str = Field("tandem", min_length=1, description="W&B project")
    entity: str | None = Field(None, description="W&B user or team (default: the API key's)")
    name: str | None = Field(None, description="run name (default: run_dir's last component)")
    group: str | None = Field(None, description="W&B group, e.g. one for the demo's stages")
    tags: list[str] = Field(default_factory=list, description="W&B tags")
    dir: str | None = Field(None, description="where W&B writes its files (default: run_dir; they go in wandb/)")


class WandbTracker(ClientRun):
    """A started W&B run (`start` makes one; call it on the tracker's own thread)."""

    @classmethod
    def start(cls, settings: WandbSettings, *, name: str, config: Mapping[str, Any], run_dir: Path) -> WandbTracker:
        import wandb

        # console="off": W&B does not wrap this process's stdout and stderr (the run's console stays its own
        # if W&B's service dies); the console is in run_dir/debug.log anyway
        return cls(wandb.init(
            project=settings.project, entity=settings.entity, name=settings.name or name, group=settings.group,
            tags=settings.tags or None, config=dict(config), mode=settings.mode, dir=settings.dir or str(run_dir),
            settings=wandb.Settings(console="off", silent=True)), wandb.Image)

    def close(self) -> None:
        import wandb

        super().close()
        # finish() returns before W&B's service has written the run's files: read right after it, an offline
        # run-<id>.wandb held no record yet (3 tries of 6 here). teardown() waits for the service to stop.
        wandb.teardown()

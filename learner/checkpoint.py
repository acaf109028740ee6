"""Checkpoints of the learner with orbax: train state + a JSON blob, the last N kept, saved async.

A checkpoint holds two items:
- `state`: the `TrainState` pytree (params, optimizer state, step, rng), written per shard;
- `meta`: JSON with the data position, the published weight version and the caller's extra state
  (e.g. the learner service's exactly-once state: consumed group ids, counters).
Restoring places every array with the sharding of the template state it is given, so a run resumes
on its mesh; together with the data position, the resumed run's next step equals the uninterrupted
run's next step (tests/test_learner_checkpoint.py shows this across processes):

    checkpointer = Checkpointer(run_dir / "checkpoints", max_to_keep=3, save_every=50)
    if (restored := checkpointer.restore(trainer.state)) is not None:
        trainer.state, batches.position = restored.state, restored.data_position
    ...
    checkpointer.save(step, trainer.state, service.state_dict(), data_position=batches.position,
                      weight_version=version)
    ...
    checkpointer.close(); trainer.export_hf(run_dir / "final", tokenizer_dir=hf_dir)
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import orbax.checkpoint as ocp

from learner.algo.train_state import TrainState, abstract_like
from learner.data import DataPosition


@dataclasses.dataclass(frozen=True)
class Restored:
    """What `Checkpointer.restore` returns."""

    step: int
    state: TrainState
    data_position: DataPosition | None
    weight_version: int
    extra: dict[str, Any]


class Checkpointer:
    """Saves at multiples of `save_every` (or when forced), keeps the newest `max_to_keep`, writes in
    the background.

    `save` returns once the arrays are copied off the devices; writing continues in a background
    thread (`wait()` blocks until it is durable; `close()` waits too).
    """

    def __init__(self, directory: Path | str, *, max_to_keep: int = 3, save_every: int = 1,
                 async_save: bool = True):
        if max_to_keep < 1 or save_every < 1:
            raise ValueError(f"max_to_keep and save_every must be >= 1, got {max_to_keep}, {save_every}")
        self.directory = Path(directory).absolute()
        self.save_every = save_every
        self._manager = ocp.CheckpointManager(
            self.directory,
            options=ocp.CheckpointManagerOptions(
                max_to_keep=max_to_keep, enable_async_checkpointing=async_save, create=True),
            item_names=("state", "meta"),
        )

    def save(self, step: int, state: TrainState, extra: dict[str, Any] | None = None, *,
             data_position: DataPosition | None = None, weight_version: int = 0,
             force: bool = False) -> bool:
        """Checkpoint `state` as step `step` if step % save_every == 0 (or `force`); True if saved.

        `extra` must be JSON-serialisable; it comes back unchanged from `restore`.
        """
        if step % self.save_every and not force:
            return False
        meta = {
            "data_position": None if data_position is None else data_position.model_dump(),
            "weight_version": int(weight_version),
            "extra": extra or {},
        }
        return self._manager.save(
            step, args=ocp.args.Composite(state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)),
            force=force)

    def latest_step(self) -> int | None:
        """Step of the newest finished checkpoint, None if there is none."""
        return self._manager.latest_step()

    def all_steps(self) -> list[int]:
        return list(self._manager.all_steps())

    def restore(self, template: TrainState, step: int | None = None) -> Restored | None:
        """Restore `step` (default: the latest) shaped and sharded like `template`; None if none exist."""
        step = self.latest_step() if step is None else step
        if step is None:
            return None
        out = self._manager.restore(step, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(abstract_like(template)), meta=ocp.args.JsonRestore()))
        meta = out["meta"]
        position = meta["data_position"]
        return Restored(
            step=step,
            state=TrainState(*out["state"]),
            data_position=None if position is None else DataPosition(**position),
            weight_version=int(meta["weight_version"]),
            extra=meta["extra"],
        )

    def wait(self) -> None:
        """Block until every pending asynchronous save is on disk."""
        self._manager.wait_until_finished()

    def close(self) -> None:
        self._manager.close()

"""The learner alone: SFT (completion-only loss) or pretraining (all tokens), from packed batches.

No actors, no reward workers, no gRPC. Resumes from the newest checkpoint, including the data
position, so a resumed run sees exactly the batches the uninterrupted one would have.
"""

from __future__ import annotations

import time

from learner.algo.train_step import Trainer
from learner.checkpoint import Checkpointer
from learner.data import PackedBatches
from learner.metrics import MetricsWriter, StepCallback


def run_supervised(trainer: Trainer, batches: PackedBatches, checkpointer: Checkpointer,
                   writer: MetricsWriter | None, *, steps: int, on_step: StepCallback | None = None) -> int:
    """Train until `steps` optimizer steps are done; returns the step it resumed from."""
    restored = checkpointer.restore(trainer.state)
    start = 0
    if restored is not None:
        trainer.state, start = restored.state, restored.step
        if restored.data_position is not None:
            batches.position = restored.data_position
    started = time.monotonic()
    for step in range(start + 1, steps + 1):
        metrics = trainer.sft_step(next(batches))
        metrics["wall_s"] = time.monotonic() - started  # since this process started training
        checkpointer.save(step, trainer.state, data_position=batches.position, force=step == steps)
        if on_step is not None:
            on_step(step, metrics)
        if writer is not None:
            writer.write(step, metrics)
    checkpointer.wait()
    return start

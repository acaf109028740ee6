"""Per-step metrics: device values to host floats, throughput, and the one writer of them: TensorBoard +
JSONL, fanned out to the experiment trackers a run turned on (learner/tracking)."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import jax
import numpy as np

from learner.tracking.tracker import Tracker

# Called after each training step with (step, metrics), before the metrics are written: a hook may add
# to them (a held-out evaluation) and they are written with the step's own (both training loops).
StepCallback = Callable[[int, dict[str, float]], None]


def to_host(metrics: Mapping[str, Any]) -> dict[str, float]:
    """Fetch a dict of scalar (device or host) values as Python floats, in one transfer."""
    host = jax.device_get(dict(metrics))
    return {name: float(np.asarray(value)) for name, value in host.items()}


class Throughput:
    """Wall time and tokens/s of one step: `with meter: ...` then `meter.metrics(num_tokens)`."""

    def __enter__(self) -> Throughput:
        self._start = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds = time.perf_counter() - self._start

    def metrics(self, num_tokens: int) -> dict[str, float]:
        return {"step_time_s": self.seconds, "tokens_per_s": num_tokens / max(self.seconds, 1e-9)}


class MetricsWriter:
    """Writes each step's scalars to TensorBoard (tensorboardX), to `metrics.jsonl` in `logdir` and to each of
    `trackers` (W&B, trackio: learner.tracking, each on its own thread, so none of them slows a step).

    Non-finite values are written too (a NaN loss must be visible, not dropped).
    """

    def __init__(self, logdir: Path | str, *, trackers: Sequence[Tracker] = (), flush_secs: int = 10):
        # tensorboardX tries `import torch` at import time; import it only when a writer is made.
        from tensorboardX import SummaryWriter

        self.logdir = Path(logdir)
        self.logdir.mkdir(parents=True, exist_ok=True)
        self.trackers = list(trackers)
        self._tb = SummaryWriter(str(self.logdir), flush_secs=flush_secs)
        self._jsonl = (self.logdir / "metrics.jsonl").open("a", encoding="utf-8")

    def write(self, step: int, metrics: Mapping[str, float]) -> None:
        for name, value in metrics.items():
            self._tb.add_scalar(name, value, global_step=step)
        record = {"step": step, **{k: (v if math.isfinite(v) else str(v)) for k, v in metrics.items()}}
        self._jsonl.write(json.dumps(record) + "\n")
        self._jsonl.flush()
        for tracker in self.trackers:
            tracker.log(step, metrics)

    def report(self, step: int, scalars: Mapping[str, float], images: Mapping[str, Path]) -> None:
        """To the trackers only, at the run's end: what its own files already hold (summary.json's final
        evaluation, curves.png), logged at `step`."""
        for tracker in self.trackers:
            if scalars:
                tracker.log(step, scalars)
            for name, path in images.items():
                tracker.image(step, name, path)

    def close(self) -> None:
        self._tb.close()
        self._jsonl.close()
        for tracker in self.trackers:
            tracker.close()

    def __enter__(self) -> MetricsWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

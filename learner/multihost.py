"""Process 0 tells the other learner processes what to train on: one message per RL step.

Only process 0 serves gRPC and sees groups, so only it can assemble a step's batch; every process
must then run the same jitted step on it (the step is one SPMD program over every host's devices).
Each step process 0 sends one message, and every other process receives it:

    batch   the assembled arrays (every process then places its own rows on its devices)
    skip    no batch this step (dynamic sampling found no group with signal)
    stop    the run ends here, with process 0's reason (no rollouts, aborted)

The message travels with `jax.experimental.multihost_utils.broadcast_one_to_all` (a psum over a
(process, local device) mesh where only process 0 contributes), in two rounds: a fixed-size header
(kind, each array's shape, the reason's bytes), then the arrays, whose shapes the header gave; every
process gets the whole batch on the host. The alternative, `make_array_from_process_local_data` with
process 0's rows resharded straight onto each device's rows, measured 12-13 ms against 19-22 ms per
step (demo batch and 10x; tests/benchmarks/bench_multihost.py), both at most 1 % of a step; it was not
taken because the step also needs the batch on every host (the skip-without-signal decision, the
token count) and the header round stays either way.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import jax
import numpy as np
from jax.experimental import multihost_utils

MAX_DIMS = 4
REASON_BYTES = 1024
KINDS = ("batch", "skip", "stop")


class RunStopped(RuntimeError):
    """Process 0 ended the run; raised on the other processes with its reason."""


@dataclass(frozen=True)
class StepMessage:
    """What process 0 sends each step. `arrays` keys and dtypes are fixed by the caller (`layout`)."""

    kind: str
    arrays: dict[str, np.ndarray] = field(default_factory=dict)
    reason: str = ""


def is_multiprocess() -> bool:
    return jax.process_count() > 1


def exchange(message: StepMessage | None, layout: Mapping[str, np.dtype]) -> StepMessage:
    """Process 0 passes its message and gets it back; every other process passes None and receives it.

    `layout` names the arrays of a batch and their dtypes, the same on every process. A collective:
    every process calls it once per step, in the same order.
    """
    leader = jax.process_index() == 0
    if leader != (message is not None):
        raise ValueError("process 0 sends a message, every other process passes None")
    names = list(layout)
    header = np.zeros(1 + len(names) * MAX_DIMS + REASON_BYTES, np.int32)
    if leader:
        header[0] = KINDS.index(message.kind)
        for i, name in enumerate(names):
            shape = message.arrays[name].shape if message.kind == "batch" else ()
            if len(shape) > MAX_DIMS:
                raise ValueError(f"{name}: {len(shape)} dims, at most {MAX_DIMS} travel")
            header[1 + i * MAX_DIMS: 1 + i * MAX_DIMS + len(shape)] = shape
            header[1 + i * MAX_DIMS + len(shape): 1 + (i + 1) * MAX_DIMS] = -1
        reason = message.reason.encode()[:REASON_BYTES]
        header[len(header) - REASON_BYTES: len(header) - REASON_BYTES + len(reason)] = list(reason)
    header = np.asarray(multihost_utils.broadcast_one_to_all(header))
    kind = KINDS[int(header[0])]
    if kind == "stop":
        reason_codes = header[len(header) - REASON_BYTES:]
        return StepMessage("stop", reason=bytes(reason_codes[reason_codes > 0].astype(np.uint8)).decode(
            errors="replace"))
    if kind == "skip":
        return StepMessage("skip")
    shapes = {name: tuple(int(d) for d in header[1 + i * MAX_DIMS: 1 + (i + 1) * MAX_DIMS] if d >= 0)
              for i, name in enumerate(names)}
    local = message.arrays if leader else {n: np.zeros(shapes[n], layout[n]) for n in names}
    received = multihost_utils.broadcast_one_to_all({n: np.asarray(local[n], layout[n]) for n in names})
    return StepMessage("batch", {n: np.asarray(received[n]) for n in names})

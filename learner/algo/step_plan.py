"""How a compiled step fits the device: its remat policy and micro-batch count, chosen per batch shape.

`train.remat: auto` takes, for each shape the step compiles for, the cheapest policy (least recompute first:
none, save_matmuls, full) whose compiled step fits the device's memory budget, judged by XLA's memory analysis
of the compiled program before anything runs. When no policy fits the batch in one pass, the batch is split
into more micro-batches (gradients accumulated; every micro-loss keeps the global batch's normaliser, so the
update is the same) under the last policy. A batch that fits in no way (one row per data shard under full
remat is still too large) raises `StepTooLargeError`, naming the sizes, before any step runs.

A fixed policy (`train.remat: full`, ...) is kept as configured; only the micro-batches grow if it does not fit.

The budget is `train.memory_budget_gib` when set, else the device's own limit less HEADROOM (accelerators
report it), else, on CPU, CPU_SHARE of the host's memory split over the mesh's devices on this host.

The choices are remembered beside JAX's persistent compilation cache (`PlanMemo`): a refused candidate is
not cached by JAX (XLA:TPU refuses an oversized program at compile time, after most of the work), so a
restarted learner would compile every refused candidate again; with the memo it tries the remembered plan
first, which the cache then loads.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import jax
import psutil

log = logging.getLogger(__name__)

REMAT_BY_COST = ("none", "save_matmuls", "full")  # least recompute (most memory) first
# of an accelerator's memory, beyond XLA's static account of the step (on a TPU v5e at 0.5B, 8 x 1024:
# save_matmuls needed 15.37 of 15.75 GiB by that account and ran; 5 % would have refused it)
HEADROOM = 0.02
CPU_SHARE = 0.5  # of the host's memory, for the step on all the mesh's (simulated) devices of this host
GIB = 2**30


class StepTooLargeError(ValueError):
    """No remat policy and micro-batch split fits the step in the memory budget."""


@dataclasses.dataclass(frozen=True)
class StepPlan:
    """A compiled step's remat policy, micro-batches, and XLA's estimate of its memory per device (bytes)."""

    remat: str
    parts: int
    device_bytes: int


def memory_budget(budget_gib: float | None, mesh: jax.sharding.Mesh) -> int:
    """The bytes a step on `mesh` may use per device: `budget_gib` if given, else the device's limit less
    HEADROOM, else (CPU reports none) CPU_SHARE of the host's memory over the mesh's devices on this host
    (simulated CPU devices share it; those outside the mesh use none of it)."""
    if budget_gib is not None:
        return int(budget_gib * GIB)
    local = mesh.local_devices
    limit = (local[0].memory_stats() or {}).get("bytes_limit")
    if limit:
        return int(limit * (1 - HEADROOM))
    return int(psutil.virtual_memory().total * CPU_SHARE / len(local))


def step_bytes(compiled: jax.stages.Compiled) -> int:
    """Device memory of a compiled step by XLA's analysis: arguments and outputs (donated ones counted once)
    plus temporaries."""
    stats = compiled.memory_analysis()
    needed = (stats.argument_size_in_bytes + stats.output_size_in_bytes - stats.alias_size_in_bytes
              + stats.temp_size_in_bytes)
    log.debug("compiled step: arguments %.2f GiB, outputs %.2f, aliased %.2f, temporaries %.2f: %.2f GiB",
              stats.argument_size_in_bytes / GIB, stats.output_size_in_bytes / GIB, stats.alias_size_in_bytes / GIB,
              stats.temp_size_in_bytes / GIB, needed / GIB)
    return needed


def candidates(remat: str, parts: int, rows: int, shards: int) -> Iterator[tuple[str, int]]:
    """(policy, micro-batches) to try, cheapest first: each policy at the configured split (only the
    configured policy unless remat is "auto"), then ever more micro-batches under the last policy, each a
    whole number of rows that divides the batch and spreads over the data shards."""
    policies = REMAT_BY_COST if remat == "auto" else (remat,)
    yield from ((policy, parts) for policy in policies)
    for more in range(parts + 1, rows // shards + 1):
        if rows % more == 0 and (rows // more) % shards == 0:
            yield policies[-1], more


def is_out_of_memory(error: Exception) -> bool:
    """Whether a compile failed because the program does not fit (XLA:TPU refuses at compile time)."""
    text = str(error)
    return "RESOURCE_EXHAUSTED" in text or "out of memory" in text.lower()


class PlanMemo:
    """Plans chosen before, by a fingerprint of what decides them, in a JSON file beside JAX's compilation
    cache (none without a cache: then nothing outlives the process anyway)."""

    FILE = "tandem_step_plans.json"

    def __init__(self, cache_dir: str | None):
        self.path = Path(cache_dir) / self.FILE if cache_dir else None
        self._lock = threading.Lock()

    @classmethod
    def for_jax_cache(cls) -> PlanMemo:
        return cls(jax.config.jax_compilation_cache_dir)

    @staticmethod
    def fingerprint(*parts: object) -> str:
        return hashlib.sha256(repr(parts).encode()).hexdigest()[:32]

    def _read(self) -> dict[str, list]:
        try:
            return json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}

    def get(self, key: str) -> tuple[str, int] | None:
        if self.path is None:
            return None
        found = self._read().get(key)
        return (str(found[0]), int(found[1])) if found else None

    def put(self, key: str, plan: StepPlan) -> None:
        if self.path is None:
            return
        with self._lock:
            memo = {**self._read(), key: [plan.remat, plan.parts]}
            tmp = self.path.with_name(f".{self.FILE}.{os.getpid()}")
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                tmp.write_text(json.dumps(memo))
                os.replace(tmp, self.path)
            except OSError as error:  # a read-only cache: the plan is chosen again next time, nothing worse
                log.warning("could not remember the step plan in %s: %s", self.path, error)


def choose(compile_step: Callable[[str, int], jax.stages.Compiled], tries: Iterator[tuple[str, int]],
           budget: int, *, what: str, remembered: tuple[str, int] | None = None) -> StepPlan:
    """The first of `tries` whose compiled step (`compile_step(policy, parts)`) fits `budget` bytes; the
    `remembered` candidate first when it is one of them.

    `what` names the step and its shape in the log and the error."""
    refused = []
    tries = list(tries)
    if remembered in tries:
        tries.remove(remembered)
        tries.insert(0, remembered)
    for policy, parts in tries:
        try:
            needed = step_bytes(compile_step(policy, parts))
        except jax.errors.JaxRuntimeError as error:
            if not is_out_of_memory(error):
                raise
            refused.append(f"{policy} remat in {parts} micro-batches: out of memory at compile "
                           f"({str(error).splitlines()[0][:200]})")
            continue
        if needed <= budget:
            log.info("%s: remat %s in %d micro-batch(es), %.2f GiB of %.2f GiB per device%s", what, policy, parts,
                     needed / GIB, budget / GIB, f" (refused: {'; '.join(refused)})" if refused else "")
            return StepPlan(policy, parts, needed)
        refused.append(f"{policy} remat in {parts} micro-batches needs {needed / GIB:.2f} GiB")
    raise StepTooLargeError(
        f"{what} does not fit in {budget / GIB:.2f} GiB per device (train.memory_budget_gib, or the device's "
        f"memory less {HEADROOM:.0%}): {'; '.join(refused)}. Use shorter rows (train.row_tokens, "
        f"rollout.max_tokens), more devices, or a larger budget")

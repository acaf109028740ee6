"""Compile every rl step shape a run can meet before it is needed, in the background, so that no step after
the first waits for XLA.

An rl batch is its groups' sequences packed into rows of `row_tokens`, the row count rounded up to a bucket
(learner.algo.rl_batch.bucket_rows). A step of P groups × G completions holds at most P·G sequences, so at
most `bucket_rows(⌈P·G / per_row⌉)` rows, where per_row = row_tokens // max_sequence_len sequences fit a
row at their longest; fewer groups (dynamic sampling) or shorter sequences give fewer rows, down to one
bucket. `CompileAhead` compiles the step for each of those buckets on a background thread while the actors
sample, nearest the expected first batch first (that is the shape the first step most likely needs), and the
later ones while the first steps run. A step whose shape is still queued compiles it itself and one being
compiled is waited for (Trainer's per-shape lock): nothing compiles twice. A batch beyond the buckets (e.g.
multi-turn episodes that split into more samples than completions) compiles on first use, and the compile
log says so.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import threading
import time

from learner.algo.rl_batch import bucket_rows
from learner.algo.train_step import Trainer
from tandem_wire.background import BackgroundLoop

log = logging.getLogger(__name__)
COMPILE_NICENESS = 10  # the background compile's scheduling priority (Unix nice; 0 is the default)


def row_buckets(most_rows: int, row_multiple: int) -> list[int]:
    """Every bucket a batch of 1 to `most_rows` rows is padded to, ascending."""
    return sorted({bucket_rows(rows, row_multiple) for rows in range(1, most_rows + 1)})


def by_nearness(buckets: list[int], expected: int) -> list[int]:
    """`buckets` ordered by distance from `expected` in log space (ties: the larger first)."""
    return sorted(buckets, key=lambda rows: (abs(math.log(rows / expected)), -rows))


class CompileAhead(BackgroundLoop):
    """A background thread compiling the rl step for `rows` buckets of `length`-token rows, in order."""

    def __init__(self, trainer: Trainer, rows: list[int], length: int, *, again: bool):
        # stop() waits for the shape in progress: never leave XLA compiling at exit
        super().__init__("compile-ahead", join_timeout_s=None)
        self.trainer, self.rows, self.length, self.again = trainer, rows, length, again

    @classmethod
    def for_run(cls, trainer: Trainer, *, sequences: int, row_tokens: int, max_sequence_len: int,
                expected_len: int, row_multiple: int, again: bool, first_only: bool = False) -> CompileAhead:
        """The buckets a step of at most `sequences` sequences of at most `max_sequence_len` tokens can fill,
        nearest first to the rows they fill at `expected_len` tokens each (`first_only`: that nearest one)."""
        def rows_at(length: int) -> int:
            return bucket_rows(-(-sequences // max(1, row_tokens // min(length, row_tokens))), row_multiple)

        most = rows_at(max_sequence_len)
        ordered = by_nearness(row_buckets(most, row_multiple), rows_at(expected_len))
        return cls(trainer, ordered[:1] if first_only else ordered, row_tokens, again=again)

    def run(self) -> None:
        # Below the loop and the actors' engines on a shared CPU (Linux nices a thread by its id): on the demo's
        # 2-core machine the 16 buckets took ~160 s of compiling beside the RL stage.
        with contextlib.suppress(OSError, AttributeError):
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), COMPILE_NICENESS)
        for rows in self.rows:
            if self.stopping.is_set():
                return
            started = time.perf_counter()
            try:
                plan = self.trainer.compile_rl_step(rows, self.length, again=self.again)
            except Exception:  # the step compiles on first use instead, and raises there if it must
                log.warning("compiling the rl step ahead (%d x %d) failed", rows, self.length, exc_info=True)
                continue
            log.info("rl step ready for %d x %d tokens (remat %s, %d micro-batches) in %.1f s", rows, self.length,
                     plan.remat, plan.parts, time.perf_counter() - started)

"""A weight version as an actor holds it once staged, and the error of a fetch that failed: what every
transport's actor half (actors/weights/staging.py, shared_memory.py, relay.py) delivers or raises."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from tandem_wire import pb
from tandem_wire.weights.manifest import FULL


class WeightTransferError(RuntimeError):
    """A weight stream that is incomplete, malformed or fails its checksum."""


class AnswerSuperseded(WeightTransferError):
    """The learner's answer named something a newer version replaced before the actor read it (e.g. a
    shared file removed meanwhile): asking once more, the same way, gets the newer one."""


@dataclass(frozen=True)
class StagedWeights:
    """A version staged whole and verified: its tensors, views into one buffer (or one mapped file)."""

    version: int
    tensors: list[tuple[str, np.ndarray]]  # views into one buffer, in the learner's order
    checksum: str
    total_bytes: int
    transfer_s: float = 0.0
    nonfinite: tuple[str, ...] | None = None  # tensors with a NaN or Inf, scanned while staging; None: unscanned
    kind: int = FULL  # what the tensors are (pb.WeightKind): it decides how they are applied (apply.py)
    adapter: dict[str, Any] | None = None  # an ADAPTER version's adapter_config.json, as its header carried it


class StagingWatcher(Protocol):
    """Sees a streamed blob land, chunk by chunk (an actor's relay forwards it before it is whole)."""

    def landed(self, header: pb.WeightHeader, buffer: np.ndarray, end: int) -> None:
        """Bytes [0, end) of the blob `header` describes are in `buffer`."""

    def finished(self, ok: bool) -> None:
        """The stream ended: verified (True) or failed (False)."""


@dataclass(frozen=True)
class Watchers:
    """Several StagingWatchers seen as one."""

    each: tuple[StagingWatcher, ...]

    def landed(self, header: pb.WeightHeader, buffer: np.ndarray, end: int) -> None:
        for watcher in self.each:
            watcher.landed(header, buffer, end)

    def finished(self, ok: bool) -> None:
        for watcher in self.each:
            watcher.finished(ok)

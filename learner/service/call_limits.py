"""Limits on the learner's long-lived calls (group streams, weight streams), so that no client can
hold the workers the short calls need.

`CallSlots` caps how many calls of one kind run at once, in all and per key (actor); a call past a
cap raises AtCapacity, which the servicer answers RESOURCE_EXHAUSTED at once, freeing its worker.
The idle reaper (tandem_wire/idle.py) cancels calls that made no progress for a timeout.
"""

from __future__ import annotations

import contextlib
import threading
from collections import Counter
from collections.abc import Iterator


class AtCapacity(Exception):
    """A call past a concurrency limit."""


class CallSlots:
    """At most `total` concurrent calls of one kind, and at most `per_key` per key (None = no per-key
    cap). Thread-safe."""

    def __init__(self, what: str, total: int, per_key: int | None = None) -> None:
        if total < 1 or (per_key is not None and per_key < 1):
            raise ValueError(f"{what}: limits must be >= 1, got total={total} per_key={per_key}")
        self._what = what
        self._total = total
        self._per_key = per_key
        self._lock = threading.Lock()
        self._held: Counter[str | None] = Counter()
        self._count = 0

    @contextlib.contextmanager
    def hold(self, key: str | None = None) -> Iterator[None]:
        """One slot for the duration of the block; raises AtCapacity when none is free."""
        with self._lock:
            if self._count >= self._total:
                raise AtCapacity(f"{self._total} {self._what} are open (the learner's limit)")
            if self._per_key is not None and self._held[key] >= self._per_key:
                raise AtCapacity(f"{self._per_key} {self._what} of {key!r} are open (the per-actor limit)")
            self._held[key] += 1
            self._count += 1
        try:
            yield
        finally:
            with self._lock:
                self._held[key] -= 1
                if not self._held[key]:
                    del self._held[key]
                self._count -= 1

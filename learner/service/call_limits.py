"""Limits on the learner's calls (group streams, weight streams, unary calls), so that no client can
hold the workers the others need.

`CallSlots` caps how many calls of one kind run at once, in all, per key (an actor id) and for the
calls that name no authenticated actor (key None, one shared bucket); a call past a cap raises
AtCapacity, which the servicer answers RESOURCE_EXHAUSTED at once, freeing its worker.
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
    """At most `total` concurrent calls of one kind, at most `per_key` per key (None = no per-key cap)
    and at most `anonymous` together for key None (None: `per_key` applies to it too). Thread-safe."""

    def __init__(self, what: str, total: int, per_key: int | None = None, anonymous: int | None = None) -> None:
        if total < 1 or any(cap is not None and cap < 1 for cap in (per_key, anonymous)):
            raise ValueError(f"{what}: limits must be >= 1, got total={total} per_key={per_key} "
                             f"anonymous={anonymous}")
        self._what = what
        self._total = total
        self._per_key = per_key
        self._anonymous = per_key if anonymous is None else anonymous
        self._lock = threading.Lock()
        self._held: Counter[str | None] = Counter()
        self._count = 0

    @contextlib.contextmanager
    def hold(self, key: str | None = None) -> Iterator[None]:
        """One slot for the duration of the block; raises AtCapacity when none is free."""
        with self._lock:
            if self._count >= self._total:
                raise AtCapacity(f"{self._total} {self._what} are open (the learner's limit)")
            cap = self._per_key if key is not None else self._anonymous
            if cap is not None and self._held[key] >= cap:
                whose = f"of {key!r}" if key is not None else "naming no registered actor"
                raise AtCapacity(f"{cap} {self._what} {whose} are open (the per-actor limit)")
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

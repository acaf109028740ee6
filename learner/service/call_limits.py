"""Limits on the learner's calls (group streams, weight streams, unary calls, Status), so that no client
can hold the workers the others need.

`CallSlots` caps how many calls of one kind run at once, in all, per key (an actor id the call proved it
speaks for) and for the calls that prove no identity (key None, one shared pool); a call past a cap
raises AtCapacity, which the servicer answers RESOURCE_EXHAUSTED at once, freeing its worker.
`SharedReply` serves Status apart: at most a few calls build it at once, and the rest share the newest
one built, so a flood of Status calls costs a few builders' time and refuses no one.
The idle reaper (tandem_wire/idle.py) cancels calls that made no progress for a timeout.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

T = TypeVar("T")


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
                if key is None:
                    raise AtCapacity(f"{cap} {self._what} without a verified identity are open (the limit for "
                                     f"all such callers together)")
                raise AtCapacity(f"{cap} {self._what} of {key!r} are open (the per-actor limit)")
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


class SharedReply(Generic[T]):
    """A reply that at most `builders` calls build at once (each under whatever lock `build` takes); a
    call that finds them all busy gets the newest reply built, at once. So a flood of callers neither
    queues on the service's lock nor is refused, and what it reads is as fresh as the last build.
    Thread-safe."""

    def __init__(self, build: Callable[[], T], builders: int) -> None:
        if builders < 1:
            raise ValueError(f"builders must be >= 1, got {builders}")
        self._build = build
        self._builders = threading.BoundedSemaphore(builders)
        self._lock = threading.Lock()
        self._tickets = itertools.count()  # the order builds started in
        self._newest: tuple[int, T] | None = None  # (ticket, reply) of the newest build finished

    def read(self) -> T:
        """A reply built now, or, while `builders` builds run, the newest one built (the first calls
        wait for a builder: nothing has been built yet)."""
        if not self._builders.acquire(blocking=self._newest is None):
            with self._lock:
                return self._newest[1]  # type: ignore[index]
        try:
            with self._lock:
                ticket = next(self._tickets)
            reply = self._build()
            with self._lock:
                if self._newest is None or self._newest[0] < ticket:
                    self._newest = (ticket, reply)
            return reply
        finally:
            self._builders.release()

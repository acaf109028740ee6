"""At most one log line per key per interval, in bounded memory: what a hostile client can make the
learner log is bounded however many calls it makes, and an actor refused again and again by a busy
learner says so once a minute, not once a call (the counters still count every one). Both ends use it."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

MAX_KEYS = 1024  # keys remembered; beyond them (a client spraying ids) all new keys share one slot
OVERFLOW = object()


class KeyedThrottle:
    """`allow(key)` is True at most once per `interval_s` for each key."""

    def __init__(self, interval_s: float, clock: Callable[[], float] = time.monotonic,
                 max_keys: int = MAX_KEYS) -> None:
        self.interval_s = interval_s
        self.clock = clock
        self._max_keys = max_keys
        self._last: dict[object, float] = {}
        self._lock = threading.Lock()  # gRPC worker threads refuse calls concurrently

    def allow(self, key: object) -> bool:
        with self._lock:
            return self._allow(key, self.clock())

    def _allow(self, key: object, now: float) -> bool:
        if key not in self._last and len(self._last) >= self._max_keys:
            self._last = {k: t for k, t in self._last.items() if now - t < self.interval_s}
            if len(self._last) >= self._max_keys:
                key = OVERFLOW
        last = self._last.get(key)
        if last is not None and now - last < self.interval_s:
            return False
        self._last[key] = now
        return True

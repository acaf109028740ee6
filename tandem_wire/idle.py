"""Cancels long calls that made no progress (no message received or sent) for a timeout: on the
learner, a stream that sends nothing or a reader that stopped reading is closed and its worker
returns; on an actor, a fetch from a relay that sends nothing gives up and streams from the learner.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator

from tandem_wire.background import BackgroundLoop


class Progress:
    """A watched call's last sign of life; `touch()` on every message received or sent."""

    __slots__ = ("at", "cancel")

    def __init__(self, cancel: Callable[[], object]) -> None:
        self.at = time.monotonic()
        self.cancel = cancel

    def touch(self) -> None:
        self.at = time.monotonic()


class IdleReaper(BackgroundLoop):
    """Cancels watched calls idle for more than `idle_timeout_s`; `on_cancel(what)` is told of each."""

    def __init__(self, idle_timeout_s: float, on_cancel: Callable[[str], None]) -> None:
        if idle_timeout_s <= 0:
            raise ValueError(f"idle_timeout_s must be > 0, got {idle_timeout_s}")
        super().__init__("tandem-idle-reaper", join_timeout_s=5)
        self._timeout_s = idle_timeout_s
        self._on_cancel = on_cancel
        self._lock = threading.Lock()
        self._watched: dict[Progress, str] = {}

    @contextlib.contextmanager
    def watch(self, what: str, cancel: Callable[[], object]) -> Iterator[Progress]:
        """Watch a call (described by `what`) for the duration of the block; `cancel` ends it."""
        progress = Progress(cancel)
        with self._lock:
            self._watched[progress] = what
        try:
            yield progress
        finally:
            with self._lock:
                self._watched.pop(progress, None)

    def run(self) -> None:
        while not self.stopping.wait(min(1.0, self._timeout_s / 4)):
            deadline = time.monotonic() - self._timeout_s
            with self._lock:
                idle = [(p, what) for p, what in self._watched.items() if p.at < deadline]
                for progress, _ in idle:
                    del self._watched[progress]
            for progress, what in idle:
                self._on_cancel(what)  # counted before the client can see the cancellation
                progress.cancel()

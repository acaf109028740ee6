"""What every experiment tracker does, and the thread that keeps the run from ever waiting on one.

A tracker (W&B, trackio: one module each) is a client of a service that may be slow, unreachable or
broken. `BackgroundTracker` runs one on a daemon thread of its own: its start and every call happen
there, the run only puts calls on a bounded queue and never blocks on it. A tracker that cannot start,
or whose call raises, logs one warning and is dropped (the run goes on without it); one that falls
behind (a call that hangs) fills its queue, and what does not fit is dropped with one warning; at the
end the run waits at most `close_timeout_s` for it to finish, then leaves it behind.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

log = logging.getLogger(__name__)

QUEUE_CAPACITY = 10_000  # calls waiting for a slow tracker (a call a step: hours of steps)
CLOSE_TIMEOUT_S = 60.0  # the longest the end of a run waits for a tracker to finish writing


class Tracker(Protocol):
    """One experiment tracker's run: scalars per step, images, and its end."""

    def log(self, step: int, scalars: Mapping[str, float]) -> None: ...

    def image(self, step: int, name: str, path: Path) -> None: ...

    def close(self) -> None: ...


class ClientRun:
    """A Tracker over a tracker client's run object of the shape W&B's and trackio's share:
    `run.log(values, step=)`, `run.finish()`, and an image type made from a file's path."""

    def __init__(self, run: Any, image_type: Callable[[str], Any]):
        self._run, self._image_type = run, image_type

    def log(self, step: int, scalars: Mapping[str, float]) -> None:
        self._run.log(dict(scalars), step=step)

    def image(self, step: int, name: str, path: Path) -> None:
        self._run.log({name: self._image_type(str(path))}, step=step)

    def close(self) -> None:
        self._run.finish()


Call = Callable[[Tracker], None]


class BackgroundTracker:
    """A tracker started and called on its own thread (the module docstring says why and how it fails)."""

    def __init__(self, name: str, start: Callable[[], Tracker], *, capacity: int = QUEUE_CAPACITY,
                 close_timeout_s: float = CLOSE_TIMEOUT_S):
        self.name, self.close_timeout_s = name, close_timeout_s
        self.failed = False  # set by the thread: it could not start, or a call raised
        self.dropped = 0  # calls not queued because the tracker fell behind or failed
        self._queue: queue.Queue[Call | None] = queue.Queue(capacity)
        self._thread = threading.Thread(target=self._work, args=(start,), name=f"tracker-{name}", daemon=True)
        self._thread.start()

    def log(self, step: int, scalars: Mapping[str, float]) -> None:
        scalars = dict(scalars)  # the caller may go on changing its dict
        self._put(lambda tracker: tracker.log(step, scalars))

    def image(self, step: int, name: str, path: Path) -> None:
        self._put(lambda tracker: tracker.image(step, name, Path(path)))

    def close(self) -> None:
        """Let the tracker finish what is queued and close, waiting `close_timeout_s` at most."""
        deadline = time.monotonic() + self.close_timeout_s
        if self._thread.is_alive():  # else it failed and is gone: nothing reads the queue
            try:
                self._queue.put(None, timeout=self.close_timeout_s)
            except queue.Full:
                pass
        self._thread.join(max(0.0, deadline - time.monotonic()))
        if self._thread.is_alive():
            log.warning("tracker %s did not finish within %.0f s; left behind (its last records may be missing)",
                        self.name, self.close_timeout_s)
        if self.dropped:
            log.warning("tracker %s: %d calls were dropped", self.name, self.dropped)

    def _put(self, call: Call) -> None:
        if self.failed:
            self.dropped += 1
            return
        try:
            self._queue.put_nowait(call)
        except queue.Full:
            if not self.dropped:
                log.warning("tracker %s is not keeping up (%d calls queued): dropping its records; the run "
                            "continues", self.name, self._queue.maxsize)
            self.dropped += 1

    def _work(self, start: Callable[[], Tracker]) -> None:
        try:
            tracker = start()
        except Exception as error:  # noqa: BLE001 - any failure of a tracker is the tracker's, not the run's
            self.failed = True
            log.warning("tracker %s could not start (%s: %s); the run continues without it",
                        self.name, type(error).__name__, error)
            return
        while (call := self._queue.get()) is not None:
            try:
                call(tracker)
            except Exception as error:  # noqa: BLE001
                self.failed = True
                log.warning("tracker %s failed (%s: %s); the run continues without it",
                            self.name, type(error).__name__, error)
                break
        try:
            tracker.close()
        except Exception as error:  # noqa: BLE001
            log.warning("tracker %s did not close cleanly (%s: %s)", self.name, type(error).__name__, error)

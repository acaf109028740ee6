"""A stoppable background loop: one named daemon thread that runs until `stop()`. The fleet supervisor,
the learner's compile-ahead thread and the idle reaper (learner service and weight relay) are each one."""

from __future__ import annotations

import threading
from typing import Self


class BackgroundLoop:
    """Runs `run()` on a daemon thread named `name` once `start()` is called; `stop()` sets `stopping`
    (which `run()` waits on or checks) and waits `join_timeout_s` for it to return (None: as long as it
    takes). Also a context manager: started on entry, stopped on exit."""

    def __init__(self, name: str, *, join_timeout_s: float | None) -> None:
        self.stopping = threading.Event()
        self._join_timeout_s = join_timeout_s
        self._thread = threading.Thread(target=self.run, name=name, daemon=True)

    def run(self) -> None:
        raise NotImplementedError

    def start(self) -> Self:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.stopping.set()
        if self._thread.is_alive():
            self._thread.join(self._join_timeout_s)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

"""Every XLA compilation of this process, counted and logged: what, how long, on which thread, and whether
JAX's persistent compilation cache answered it (a hit loads an executable compiled before, by this or an
earlier process).

    compile_log = CompileLog.install()          # once per process; idempotent
    ...
    records = compile_log.since(mark)           # CompileRecords after an earlier `compile_log.mark()`

JAX reports each backend compilation through `jax.monitoring` (BACKEND_COMPILE_EVENT, its duration and the
jitted function's name) and, inside it, a cache-hit event when the persistent cache had the executable. The
listener pairs the two per thread (a background compile and the train loop can compile at once).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from typing import ClassVar

import jax

log = logging.getLogger(__name__)

BACKEND_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"  # jax._src.dispatch's name for it
CACHE_HIT_EVENT = "/jax/compilation_cache/cache_hits"
STEP_NAME = "train_step_"  # the trainer's jitted updates are train_step_<kind> (JAX reports jit(train_step_rl))
LOUD_SECONDS = 1.0  # compiles at least this long, and every train step's, are logged at INFO; others at DEBUG


@dataclasses.dataclass(frozen=True)
class CompileRecord:
    """One backend compilation: the jitted function's name, its seconds (a hit: the load's), the thread that
    ran it, whether the persistent cache answered it, and when it ended (time.monotonic())."""

    function: str
    seconds: float
    thread: str
    cache_hit: bool
    ended: float

    @property
    def is_step(self) -> bool:
        return STEP_NAME in self.function


class CompileLog:
    """The process's compilations since `install` (one instance a process: JAX's listeners are global)."""

    _installed: ClassVar[CompileLog | None] = None
    _install_lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._records: list[CompileRecord] = []
        self._hit = threading.local()

    @classmethod
    def install(cls) -> CompileLog:
        """The process's log, registering JAX listeners on first call."""
        with cls._install_lock:
            if cls._installed is None:
                cls._installed = cls()
                jax.monitoring.register_event_listener(cls._installed._on_event)
                jax.monitoring.register_event_duration_secs_listener(cls._installed._on_duration)
            return cls._installed

    def _on_event(self, event: str, **_: object) -> None:
        if event == CACHE_HIT_EVENT:
            self._hit.value = True

    def _on_duration(self, event: str, duration_secs: float, fun_name: str = "?", **_: object) -> None:
        if event != BACKEND_COMPILE_EVENT:
            return
        hit, self._hit.value = getattr(self._hit, "value", False), False
        record = CompileRecord(fun_name, duration_secs, threading.current_thread().name, hit, time.monotonic())
        with self._lock:
            self._records.append(record)
        level = logging.INFO if record.is_step or duration_secs >= LOUD_SECONDS else logging.DEBUG
        log.log(level, "%s %s in %.2f s (thread %s)", "loaded from the compilation cache" if hit else "compiled",
                fun_name, duration_secs, record.thread)

    def mark(self) -> int:
        """A position in the log, for `since`."""
        with self._lock:
            return len(self._records)

    def since(self, mark: int = 0) -> list[CompileRecord]:
        with self._lock:
            return self._records[mark:]


def summarize(records: list[CompileRecord]) -> dict[str, float]:
    """Counts and seconds of `records`: compiled (cache misses) and loaded from the persistent cache."""
    compiled = [r for r in records if not r.cache_hit]
    loaded = [r for r in records if r.cache_hit]
    return {"compiles": float(len(compiled)), "compile_s": sum(r.seconds for r in compiled),
            "cache_loads": float(len(loaded)), "cache_load_s": sum(r.seconds for r in loaded)}

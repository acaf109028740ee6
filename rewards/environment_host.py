"""Episodes of an environment in an isolated child process that is replaced whenever a call hangs or
kills it (the reward worker's side of rewards/environment_child.py).

Each call waits at most the reward timeout. On a timeout the child is killed; if it dies (``os._exit``,
a segfault, the OOM killer) the call in flight is ``crashed``. A fresh child serves the next call, and
the episodes that lived in the old one answer ``lost``: each failure makes one trajectory unscorable
(reason ``environment:<why>``) and is counted; none ends the worker.
"""

from __future__ import annotations

import collections
import sys
from collections.abc import Mapping

from rewards.environments import Step
from rewards.isolation import ChildProcess, Gone
from rewards.spec import RewardSpec
from rewards.types import RewardStats

REASON_PREFIX = "environment:"


class IsolatedEnvironment:
    """Runs ``spec.environment``'s episodes, one per key, in a recycled child process."""

    def __init__(self, spec: RewardSpec, startup_timeout_s: float = 60.0) -> None:
        if spec.environment is None:
            raise ValueError("IsolatedEnvironment needs a spec with an environment")
        self._spec = spec
        self._startup_timeout_s = startup_timeout_s
        self._counts: collections.Counter[str] = collections.Counter()  # episodes, steps, restarts
        self._failures: collections.Counter[str] = collections.Counter()  # by reason
        self._child = self._start()

    def reset(self, key: str, row: Mapping[str, str]) -> str | None:
        """Start episode `key` for the prompt `row`; None, or the unscorable reason it failed with."""
        self._counts["episodes"] += 1
        return self._call(("reset", key, dict(row)))

    def step(self, key: str, reply: str) -> Step | str:
        """The environment's Step for the assistant's `reply`, or the unscorable reason it has none."""
        self._counts["steps"] += 1
        return self._call(("step", key, reply))

    def close(self, key: str) -> None:
        """Forget episode `key` (the trajectory was abandoned); nothing to do if the child is gone."""
        try:
            self._child.send(("close", key))
        except Gone:
            self._restart()

    def stats(self) -> RewardStats:
        """Episodes started, steps taken, child restarts and failed calls by reason."""
        return RewardStats(restarts=self._counts["restarts"], failures=dict(self._failures),
                           episodes=self._counts["episodes"], steps=self._counts["steps"])

    def shutdown(self) -> None:
        self._child.kill()

    def _call(self, message: tuple):
        try:
            if not self._child.alive():
                self._restart()
            self._child.send(message)
            status, answer = self._child.receive(self._spec.timeout_s)
        except Gone as gone:
            self._restart()
            status, answer = "error", gone.reason
        if status == "ok":
            return answer
        reason = REASON_PREFIX + answer
        self._failures[reason] += 1
        return reason

    def _start(self) -> ChildProcess:
        environment = self._spec.environment
        init = ("init", sys.path, self._spec.imports, environment.ref, environment.kwargs)
        return ChildProcess("rewards.environment_child", init, self._startup_timeout_s, "the environment")

    def _restart(self) -> None:
        self._child.kill()
        self._child = self._start()
        self._counts["restarts"] += 1

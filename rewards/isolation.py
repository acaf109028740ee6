"""Scoring in an isolated child process that is replaced whenever a reward call hangs or kills it.

Per group: the child runs the group's units (see :mod:`rewards.scoring`) and reports each one.
The parent waits at most the call timeout per unit. On a timeout it kills the child; if the child
dies (``os._exit``, a segfault, the OOM killer) the unit in flight is ``crashed``. Either way
only that unit's completions get the reason; a fresh child scores the remaining units of the
group, so one bad completion never spoils the others.
"""

import collections
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Sequence
from multiprocessing.connection import Connection
from pathlib import Path

from rewards.scoring import CRASHED, TIMEOUT, Outcome, combine, plan_units
from rewards.spec import RewardSpec
from rewards.types import RewardStats, ScoreResult

# Extra wait for async units: their calls time out inside the child first, which keeps the
# reasons per completion; the parent's limit only catches an event loop that user code blocked.
_ASYNC_GRACE_S = 0.5
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[1])


class RewardChildError(RuntimeError):
    """The child could not load the reward functions (bad reference, import error)."""


class Gone(Exception):
    """The child is dead or was killed; ``reason`` is what that means for the call in flight."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class ChildProcess:
    """One child process (``python -m <module> FD``) and its socket; it answers `init` with
    ``("ready", payload)`` or ``("init_error", message)``. Shared by reward scoring and environments."""

    def __init__(self, module: str, init: tuple, startup_timeout_s: float, what: str) -> None:
        ours, theirs = socket.socketpair()
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [_PACKAGE_ROOT, env.get("PYTHONPATH")]))
        self.process = subprocess.Popen(
            [sys.executable, "-m", module, str(theirs.fileno())],
            pass_fds=[theirs.fileno()], env=env, start_new_session=True,
        )
        theirs.close()
        self.connection = Connection(ours.detach())
        try:
            self.send(init)
            message = self.receive(startup_timeout_s)
        except Gone as gone:
            self.kill()
            raise RewardChildError(f"{what} child did not start ({gone.reason}, exit code "
                                   f"{self.process.returncode})") from None
        if message[0] == "init_error":
            self.kill()
            raise RewardChildError(f"cannot load {what}: {message[1]}")
        self.ready_payload = message[1]

    def receive(self, timeout_s: float) -> tuple:
        try:
            if not self.connection.poll(timeout_s):
                self.kill()
                raise Gone(TIMEOUT)
            return self.connection.recv()
        except (EOFError, OSError):
            self.kill()
            raise Gone(CRASHED) from None

    def send(self, message: tuple) -> None:
        try:
            self.connection.send(message)
        except OSError:
            self.kill()
            raise Gone(CRASHED) from None

    def alive(self) -> bool:
        """Running (checked without reaping it, so that kill() can still end its process group)."""
        if self.connection.closed or self.process.returncode is not None:
            return False
        return os.waitid(os.P_PID, self.process.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None

    def kill(self) -> None:
        """Kill the child and whatever it started in its process group, then reap it."""
        if self.process.returncode is None:  # not reaped yet, so the group id is still ours
            try:
                os.killpg(self.process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.process.wait()
        self.connection.close()


class IsolatedScorer:
    """Scores groups with ``spec`` in a recycled child process; counts outcomes for :meth:`stats`."""

    def __init__(self, spec: RewardSpec, startup_timeout_s: float = 60.0) -> None:
        self._spec = spec
        self._startup_timeout_s = startup_timeout_s
        self._names = [f.component_name for f in spec.functions]
        self._weights = [f.weight for f in spec.functions]
        self._counts: collections.Counter[str] = collections.Counter()  # scored, unscorable, restarts
        self._failures: collections.Counter[str] = collections.Counter()  # by "<component>:<reason>"
        self._child = self._start()

    def score(self, prompt: str, completions: Sequence[tuple[str, list[int]]], metadata: dict
              ) -> list[ScoreResult]:
        """One :class:`ScoreResult` per completion (``completions``: ``(text, token_ids)`` pairs)."""
        completions = [(text, list(ids)) for text, ids in completions]
        per_group = self._child.ready_payload  # per component: one unit per group
        units = plan_units(per_group, len(completions))
        outcomes: list[list[Outcome]] = [[(None, None)] * len(completions) for _ in per_group]
        next_unit = 0
        while next_unit < len(units):
            try:
                if not self._child.alive():
                    self._restart()
                self._child.send(("score", prompt, completions, metadata, next_unit))
                while next_unit < len(units):
                    unit = units[next_unit]
                    wait_s = self._spec.timeout_s + (_ASYNC_GRACE_S if per_group[unit.component] else 0.0)
                    _, index, unit_outcomes = self._child.receive(wait_s)
                    if index != next_unit:
                        raise RuntimeError(f"reward child answered unit {index}, expected {next_unit}")
                    self._record(outcomes, unit, unit_outcomes)
                    next_unit += 1
            except Gone as gone:
                unit = units[next_unit]
                self._record(outcomes, unit, [(None, gone.reason)] * len(unit.completions))
                next_unit += 1
                self._restart()
            except BaseException:
                self._child.kill()  # its remaining answers would be mistaken for the next group's
                raise
        results = combine(self._names, self._weights, outcomes)
        for result in results:
            self._counts["scored" if result.scorable else "unscorable"] += 1
        return results

    def stats(self) -> RewardStats:
        """Completions scored and unscorable, failed calls by reason, restarts of the child."""
        return RewardStats(scored=self._counts["scored"], unscorable=self._counts["unscorable"],
                           restarts=self._counts["restarts"], failures=dict(self._failures))

    def close(self) -> None:
        self._child.kill()

    def _record(self, outcomes: list[list[Outcome]], unit, unit_outcomes: list[Outcome]) -> None:
        for completion, outcome in zip(unit.completions, unit_outcomes, strict=True):
            outcomes[unit.component][completion] = outcome
            if outcome[1] is not None:
                self._failures[f"{self._names[unit.component]}:{outcome[1]}"] += 1

    def _start(self) -> ChildProcess:
        functions = [(f.component_name, f.ref, f.kwargs) for f in self._spec.functions]
        init = ("init", sys.path, self._spec.imports, functions, self._spec.timeout_s)
        return ChildProcess("rewards.child", init, self._startup_timeout_s, "reward functions")

    def _restart(self) -> None:
        self._child.kill()
        self._child = self._start()
        self._counts["restarts"] += 1

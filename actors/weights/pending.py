"""An actor's weight swap as plain state: which fetched version waits to be loaded, and when it is due.

A version is fetched and checked while the engine keeps sampling; it must be loaded between two
engine steps. An idle engine loads it at once, and so does a busy one whose groups continue on it
(rollout.weight_update=keep, or an adapter: the actor offers it with in_flight=0). Otherwise (abort)
no group may mix two versions and the busy engine (the streaming loop) drains: no new prompts, the
groups in flight finish on the weights they started with, and the version is due when none is left,
or once `drain_steps` engine steps have passed (the rest is aborted and sampled again on it), or at
once when the engine is held and cannot drain (the actor is blocked on the learner's credits). A
version whose fetch or check failed is rejected: it is not fetched again before its retry time.

No threads, engine or gRPC: RolloutActor holds it under its engine lock, tells it what happened and
loads what it says is due; time is passed in (`now`, monotonic seconds).

          ┌─────────────────────── offer(v, in_flight=0) ──────────────────────┐
          │                                                                    ▼
    ┌───────────┐  offer(v, in_flight>0)  ┌────────────┐  stepped(0)         ┌───────┐
    │  SERVING  │ ──────────────────────► │ DRAINING v │  stepped(n) at      │ DUE v │
    │  served   │                         │ steps_left │ ──────────────────► │       │
    └───────────┘                         └────────────┘  steps_left=0       └───────┘
          ▲                                  │     ▲      force()                 │
          │                                  └─────┘                              │
          │                      stepped(n>0): steps_left -= 1                    │
          └─────────────────────────── loaded(v): served = v ─────────────────────┘

  - offer(v') in DRAINING v or DUE v: v is superseded, v' starts afresh (DRAINING, or DUE when
    in_flight=0). The last offer wins whatever its number: offers come one at a time, each the
    learner's newest, which is older than ours after the learner restarted from a checkpoint.
  - stepped and force in SERVING or DUE change nothing; loaded(u) of a version u not pending only
    sets served = u.
  - reject(v, now, retry_after_s), in any state: `wants(v, now')` is False until now + retry_after_s
    (inf: never again); what is pending stays.
  - wants(latest, now): fetch `latest`? Not when it is served, pending, or rejected and not yet
    due for a retry.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, TypeVar

__all__ = ["Due", "PendingWeights"]

T = TypeVar("T")


@dataclass(frozen=True)
class Due(Generic[T]):
    """A version to load now, with what the actor staged for it."""

    version: int
    staged: T


@dataclass
class _Pending(Generic[T]):
    version: int
    staged: T
    steps_left: int
    due: bool


class PendingWeights(Generic[T]):
    """The swap state of one actor (see the module docstring); `staged` is opaque to it. Not thread-safe."""

    def __init__(self, served: int, drain_steps: int) -> None:
        """`served`: the version the engine starts with; `drain_steps`: engine steps a pending
        version waits for the groups in flight before it is forced in."""
        self.served = served
        self._drain_steps = drain_steps
        self._pending: _Pending[T] | None = None
        self._retry_at: dict[int, float] = {}  # rejected version -> when it may be fetched again

    @property
    def pending_version(self) -> int | None:
        """The version waiting to be loaded (draining or due), if any."""
        return self._pending.version if self._pending else None

    def wants(self, latest: int, now: float) -> bool:
        """Whether the learner's `latest` version is worth fetching at `now`."""
        return (latest != self.served and latest != self.pending_version
                and now >= self._retry_at.get(latest, 0.0))

    def reject(self, version: int, now: float, retry_after_s: float) -> None:
        """`version` failed its transfer or check: not wanted again before `now + retry_after_s`."""
        self._retry_at[version] = now + retry_after_s

    def offer(self, version: int, staged: T, in_flight: int) -> None:
        """A version fetched and checked, with `in_flight` groups in the engine: it replaces any
        pending one, and is due at once on an idle engine."""
        self._pending = _Pending(version, staged, self._drain_steps, due=in_flight == 0)

    def stepped(self, in_flight: int) -> None:
        """One engine step ended with `in_flight` groups left: the pending version is due once none
        is, or when no drain step is left; else one is spent."""
        pending = self._pending
        if pending is None or pending.due:
            return
        if in_flight == 0 or pending.steps_left == 0:
            pending.due = True
        else:
            pending.steps_left -= 1

    def force(self) -> None:
        """The engine is held and cannot drain: the pending version is due now."""
        if self._pending is not None:
            self._pending.due = True

    def due(self) -> Due[T] | None:
        """The version to load now, if any (unchanged until `loaded`)."""
        pending = self._pending
        return Due(pending.version, pending.staged) if pending and pending.due else None

    def loaded(self, version: int) -> None:
        """The engine now serves `version`; a pending version of that number is done."""
        self.served = version
        if self._pending is not None and self._pending.version == version:
            self._pending = None

"""What rollout actors and their fleet report across Ray: typed, so a caller reads fields, not keys.

Light on import (no vLLM, no Ray at run time), so the driver, its supervisor and the tests use these
types without loading an engine. ``dataclasses.asdict`` turns any of them into a run summary's JSON.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import ray


@dataclass
class WeightUpdate:
    """One version an actor loaded."""

    version: int
    transfer_s: float  # download + checksum, overlapped with sampling
    stall_s: float     # time the engine could not sample: aborting + loading under the engine lock


@dataclass
class ActorCounters:
    """What one actor counts as it runs (its samplers count tokens, engine time and groups sent)."""

    tokens_generated: int = 0
    generate_seconds: float = 0.0
    groups_sent: int = 0
    prompts_filtered: int = 0
    weight_updates: list[WeightUpdate] = field(default_factory=list)
    weight_rejections: int = 0


@dataclass(frozen=True)
class ActorStats:
    """One rollout actor's counters (``RolloutActor.stats()``; ``run()`` and ``stop()`` return it too)."""

    actor_id: str
    """the actor's id in its fleet"""
    version: int
    """the weight version its engine serves"""
    tokens_generated: int
    """completion tokens sampled"""
    tokens_per_second: float
    """generated tokens per second of generate time"""
    groups_sent: int
    """scored groups handed to the learner client"""
    prompts_filtered: int
    """prompts refused as longer than its max_prompt_tokens"""
    versions_applied: tuple[int, ...]
    """each weight version it loaded, in order"""
    stall_seconds: tuple[float, ...]
    """per loaded version: time the engine could not sample (aborting the groups in flight + loading)"""
    transfer_seconds: tuple[float, ...]
    """per loaded version: download + checksum + validation, overlapped with sampling"""
    weight_rejections: int
    """versions it fetched but did not apply (transfer or validation failed)"""
    tokens_aborted: int
    """completion tokens thrown away: groups in flight when a new version was loaded are sampled again"""
    tokens_recomputed: int
    """weight_update=keep: prompt and sampled tokens whose KV was recomputed on a version loaded in flight"""
    recompute_seconds: float
    """weight_update=keep: seconds of the first engine step after each in-flight load (it holds the recompute)"""
    generate_seconds: float
    """time spent inside engine steps"""
    credit_wait_seconds: float
    """idle, blocked on the learner's credits (its queue is full)"""
    prompt_wait_seconds: float
    """idle, no prompt to lease"""
    idle_seconds: float
    """idle for any reason: blocked on credits, no prompt to lease, or a weight load stalling the engine,
    each moment counted once (in sync mode the lease budget holds the actor while its weights thread loads
    the new version: the two waits overlap, and their sum would exceed the wall time)"""
    unacked: int
    """groups sent without a final ack yet"""
    engine_busy_s: float
    """how long the running engine step or generate has been busy (0 when none): a supervisor replaces a
    stuck engine"""
    rss_bytes: int
    """resident memory of the actor's process"""
    weight_sources: dict[str, int]
    """how its weight versions arrived: shared (memory), streamed (from the learner), relayed (from another
    actor), shared_failed and relay_failed (then streamed)"""
    relay_bytes_served: int
    """weight bytes its relay forwarded to other actors"""
    calls_refused: dict[str, int] = field(default_factory=dict)
    """learner calls refused busy or unavailable, each tried again after a back-off, by "<method> <code>"
    (e.g. "LeasePrompts RESOURCE_EXHAUSTED")"""
    episodes: dict[str, int] = field(default_factory=dict)
    """multi-turn (an environment): trajectories, turns, tool_calls, tool_errors, samples_split (new training
    samples where the chat template could not extend the tokens), and ended/<why> for each way a
    trajectory ended (done, max_turns, tool_errors, max_tokens, context, template_refused, unscorable);
    {} without"""
    adapters: tuple[str, ...] = ()
    """LoRA (model.lora): the adapter versions loaded in its engine, by their vLLM names (policy-v<n>), oldest
    first: the newest max_staleness + 1, and an older one while a group in flight still samples with it; ()
    without"""


class TimeShareMeter:
    """Where the wall time went since the previous reading, from cumulative seconds per activity
    (the shares an actor's heartbeat carries: busy, lease_wait, credit_wait, weight_stall).

    The shares add up to at most 1: a weight stall is counted when it ends and may reach back into
    the previous interval, so an interval whose counted seconds exceed its length is scaled down."""

    def __init__(self, now: float, totals: dict[str, float]) -> None:
        self._now, self._totals = now, dict(totals)

    def read(self, now: float, totals: dict[str, float]) -> dict[str, float]:
        deltas = {k: max(0.0, v - self._totals.get(k, 0.0)) for k, v in totals.items()}
        span = max(now - self._now, sum(deltas.values()), 1e-9)
        self._now, self._totals = now, dict(totals)
        return {k: min(1.0, d / span) for k, d in deltas.items()}


class UnionClock:
    """Wall time during which at least one of several possibly overlapping activities runs.

    Each activity enters ``running()`` from its own thread; the clock runs from the first entry to the
    last exit, so overlaps are counted once (a sum of per-activity counters counts them twice)."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._running = 0
        self._since = 0.0
        self._total = 0.0

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        with self._lock:
            if self._running == 0:
                self._since = self._clock()
            self._running += 1
        try:
            yield
        finally:
            with self._lock:
                self._running -= 1
                if self._running == 0:
                    self._total += self._clock() - self._since

    def seconds(self) -> float:
        """The total so far, a running stretch included."""
        with self._lock:
            return self._total + (self._clock() - self._since if self._running else 0.0)


@dataclass(frozen=True)
class NoAnswer:
    """An actor that did not answer ``stats()`` in time (``ActorFleet.stats()``)."""

    error: str
    """the failed call, as repr()"""
    dead: bool
    """its process is gone (else it is busy, or hung)"""


@dataclass(frozen=True)
class GivenUp:
    """A slot whose actors kept dying right after they started."""

    actor_id: str
    """the last actor of the slot"""
    failures: int
    """quick deaths in a row"""
    reason: str
    """why it was given up, for the log and the run summary"""


@dataclass(frozen=True)
class FleetHealth:
    """The fleet's slots (``ActorFleet.health()``): running, waiting out a back-off, given up."""

    actors: tuple[str, ...]
    """live actor ids, oldest first"""
    pending: dict[str, float]
    """dead actor id -> seconds until its replacement starts"""
    given_up: tuple[GivenUp, ...]
    """slots no longer restarted"""


@dataclass(frozen=True)
class FleetInfo:
    """What a named fleet says of itself (``NamedFleet.describe()``), for a driver deciding to re-attach."""

    run_key: str
    """the run (and its actor and reward settings) it serves"""
    idle_s: float
    """seconds since a driver last touched it"""
    learner_address: str
    """where its actors send their groups"""
    actors: tuple[str, ...]
    """live actor ids"""
    reward_handles: tuple[ray.actor.ActorHandle, ...]
    """the reward workers it owns"""

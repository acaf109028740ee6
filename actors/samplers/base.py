"""The interface a rollout actor's loop drives, one implementation per sampling mode.

The actor (actors/rollout_actor.py) owns the lease loop, the weights thread and the connection; a sampler
owns the groups between lease and send: it takes leased prompts (``submit``), advances them (``step``:
one engine step, or a whole batch), sends what is done (``collect``), and says how a new weight version
reaches the groups it holds (``waits_for`` and ``load``, by its WeightUpdatePolicy,
actors/samplers/updates.py). The modes: ``batch.py`` (sync), ``streaming.py`` (async single-turn),
``episodes.py`` (async multi-turn); ``modes.py`` picks one from the actor's config.
"""

from __future__ import annotations

import abc
import contextlib
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from actors.engine import RolloutEngine, SamplingSpec
from actors.learner_client import Prompt
from actors.samplers.updates import WeightUpdatePolicy
from actors.scoring import RewardScorer
from actors.stats import ActorCounters
from actors.weights.apply import Applier
from tandem_wire import tandem_pb2 as pb


@dataclass(frozen=True)
class SamplerRig:
    """What a sampler uses of its actor."""

    actor_id: str
    engine: RolloutEngine
    engine_lock: threading.RLock  # one engine step, generate or weight load at a time
    scorer: RewardScorer
    sampling: SamplingSpec  # the actor's: n is the group size
    counters: ActorCounters
    version: Callable[[], int]  # the weight version served now
    send: Callable[[pb.ScoredGroup], None]  # to the learner; blocks while it has no credits for us


class Sampler(abc.ABC):
    """The groups one actor is sampling, from their leases until they are sent."""

    def __init__(self, rig: SamplerRig, updates: WeightUpdatePolicy) -> None:
        self.rig, self.engine, self.updates = rig, rig.engine, updates
        self.generating_since: float | None = None  # monotonic start of the running engine call, if any

    @abc.abstractmethod
    def held(self) -> set[str]:
        """The group ids of the leases held, from submit until sent (in the engine, being scored, between
        turns): a lease coming back for one of them is not sampled again; none held, the actor waits."""

    @property
    @abc.abstractmethod
    def sampling_count(self) -> int:
        """How many groups take room in the batch (being sampled; a group being scored takes none)."""

    @abc.abstractmethod
    def submit(self, leases: Sequence[Prompt]) -> None:
        """Start sampling the groups of `leases` (already checked to fit), with the version served now."""

    @abc.abstractmethod
    def step(self) -> None:
        """Advance the groups held by one engine call."""

    @abc.abstractmethod
    def collect(self) -> None:
        """Send the groups that are done (after ``step``)."""

    def resubmit(self, keys: Sequence[str]) -> None:
        """Sample the engine requests `keys` again, aborted by a weight load, with the version then served."""
        raise RuntimeError(f"{type(self).__name__} holds nothing in the engine between two calls; aborted {keys}")

    def episode_counts(self) -> dict[str, int]:
        """What its multi-turn episodes did (ActorStats.episodes); none in the single-turn modes."""
        return {}

    # ------------------------------------------------------------------ weights

    def waits_for(self, apply: Applier) -> int:
        """How many requests in flight a new version of `apply`'s kind waits for before it loads."""
        return self.updates.waits_for(apply, self.engine)

    def load(self, apply: Applier, weights: object, version: int) -> float:
        """Load a version (engine lock held) as the policy says; returns the seconds sampling stalled."""
        return self.updates.load(apply, weights, version, self.engine, self.paused)

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Hold the engine with nothing in flight: the requests running are aborted (their tokens counted
        in tokens_aborted) and sampled again afterwards (``resubmit``)."""
        with self.rig.engine_lock:
            aborted = self.engine.abort_all()
            try:
                yield
            finally:
                if aborted:
                    self.resubmit(aborted)

    @contextlib.contextmanager
    def generating(self) -> Iterator[None]:
        """Time an engine call: ``generating_since`` while it runs, its length in generate_seconds."""
        start = time.perf_counter()
        self.generating_since = time.monotonic()
        try:
            yield
        finally:
            self.generating_since = None
            self.rig.counters.generate_seconds += time.perf_counter() - start

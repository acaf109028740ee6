"""How a new weight version reaches the requests in flight (``rollout.weight_update``): a sampler's policy.

``keep`` (PipelineRL's and AReaL's in-flight update, KeepInFlight): the version loads at once and the
requests in flight continue on it (RolloutEngine.update_in_flight: vLLM's pause in keep mode, their KV
recomputed on the new weights); no sampled token is lost, and each token carries the version that sampled it.

``abort`` (AbortInFlight): a version whose kind ``drains`` (full weights) waits until the requests in flight
have finished on the weights they started with, or until ``weight_drain_steps`` engine steps passed
(actors/weights/pending.py), when the rest are aborted, the version loaded, and they are sampled again on it
(their tokens counted in ``tokens_aborted``); so no group mixes two versions. An adapter loads beside the
requests in flight, which keep the adapter they started with, under either policy.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Protocol

from actors.engine import RolloutEngine
from actors.weights.apply import Applier

Pause = Callable[[], AbstractContextManager[None]]  # holds the engine with nothing in flight, then resamples


class WeightUpdatePolicy(Protocol):
    def waits_for(self, apply: Applier, engine: RolloutEngine) -> int:
        """How many requests in flight a new version waits for before it loads (0: due at once)."""

    def load(self, apply: Applier, weights: object, version: int, engine: RolloutEngine, pause: Pause) -> float:
        """Load a due version (engine lock held); returns the seconds sampling stalled."""


class KeepInFlight:
    """``keep``: loaded at once, the requests in flight continue on it."""

    def waits_for(self, apply: Applier, engine: RolloutEngine) -> int:
        return 0

    def load(self, apply: Applier, weights: object, version: int, engine: RolloutEngine, pause: Pause) -> float:
        if engine.in_flight:
            return apply.load_in_flight(engine, weights, version)
        return apply.load(engine, weights, version)


class AbortInFlight(KeepInFlight):
    """``abort``: a draining kind waits for the requests in flight, then aborts and resamples what is left."""

    def waits_for(self, apply: Applier, engine: RolloutEngine) -> int:
        return engine.in_flight if apply.drains else 0

    def load(self, apply: Applier, weights: object, version: int, engine: RolloutEngine, pause: Pause) -> float:
        if not apply.drains:
            return super().load(apply, weights, version, engine, pause)
        with pause():
            return apply.load(engine, weights, version)


POLICIES: dict[str, type[KeepInFlight]] = {"keep": KeepInFlight, "abort": AbortInFlight}

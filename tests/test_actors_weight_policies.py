"""The samplers' weight-update policies (actors/samplers/updates.py) as plain decisions: how many requests in
flight a version waits for, and which load runs (in place beside the requests in flight, or with the engine
paused and its requests resampled). No engine: the real paths are tests/test_actors_streaming.py's."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest

from actors.samplers.updates import POLICIES, AbortInFlight, KeepInFlight
from actors.weights.apply import Applier


class _Engine:
    def __init__(self, in_flight: int) -> None:
        self.in_flight = in_flight
        self.calls: list[str] = []


def _applier(drains: bool) -> Applier:
    return Applier(check=lambda engine, staged: staged,
                   load=lambda engine, weights, version: engine.calls.append(f"load v{version}") or 1.0,
                   load_in_flight=lambda engine, weights, version: engine.calls.append(f"in flight v{version}") or 2.0,
                   drains=drains)


def _pause(engine: _Engine):
    @contextlib.contextmanager
    def pause() -> Iterator[None]:
        engine.calls.append(f"abort {engine.in_flight}")
        yield
        engine.calls.append("resample")
    return pause


@pytest.mark.parametrize("drains", [True, False])
def test_keep_loads_at_once_beside_the_requests_in_flight(drains):
    engine = _Engine(in_flight=3)
    assert KeepInFlight().waits_for(_applier(drains), engine) == 0
    assert KeepInFlight().load(_applier(drains), "w", 4, engine, _pause(engine)) == 2.0
    assert engine.calls == ["in flight v4"]


def test_keep_with_nothing_in_flight_is_a_plain_load():
    engine = _Engine(in_flight=0)
    assert KeepInFlight().load(_applier(True), "w", 4, engine, _pause(engine)) == 1.0
    assert engine.calls == ["load v4"]


def test_abort_waits_for_the_requests_in_flight_then_aborts_loads_and_resamples_the_rest():
    engine = _Engine(in_flight=3)
    assert AbortInFlight().waits_for(_applier(True), engine) == 3
    assert AbortInFlight().load(_applier(True), "w", 4, engine, _pause(engine)) == 1.0
    assert engine.calls == ["abort 3", "load v4", "resample"]


def test_abort_loads_an_adapter_beside_the_requests_in_flight():
    engine = _Engine(in_flight=3)
    assert AbortInFlight().waits_for(_applier(False), engine) == 0
    assert AbortInFlight().load(_applier(False), "w", 4, engine, _pause(engine)) == 2.0
    assert engine.calls == ["in flight v4"]


def test_every_configured_weight_update_has_its_policy():
    from typing import get_args

    from actors.config import ActorConfig

    assert set(POLICIES) == set(get_args(ActorConfig.model_fields["weight_update"].annotation))

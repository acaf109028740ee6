"""TimeShareMeter: the shares of wall time an actor's heartbeat carries; UnionClock: its idle time."""

from __future__ import annotations

import pytest

from actors.stats import TimeShareMeter, UnionClock


def test_shares_are_the_seconds_of_each_activity_over_the_interval():
    meter = TimeShareMeter(10.0, {"busy": 1.0, "lease_wait": 0.0})
    assert meter.read(14.0, {"busy": 3.0, "lease_wait": 1.0}) == {"busy": 0.5, "lease_wait": 0.25}
    # the next reading counts from this one, not from the start
    assert meter.read(16.0, {"busy": 3.0, "lease_wait": 3.0}) == {"busy": 0.0, "lease_wait": 1.0}


def test_seconds_counted_late_are_scaled_so_the_shares_never_exceed_the_whole():
    # a 1.5 s weight stall that ended in a 1 s interval (it began in the previous one)
    meter = TimeShareMeter(0.0, {"busy": 0.0, "weight_stall": 0.0})
    shares = meter.read(1.0, {"busy": 0.5, "weight_stall": 1.5})
    assert shares == {"busy": pytest.approx(0.25), "weight_stall": pytest.approx(0.75)}
    assert sum(shares.values()) <= 1.0


def test_a_counter_that_went_backwards_counts_as_no_time():
    meter = TimeShareMeter(0.0, {"busy": 5.0})
    assert meter.read(2.0, {"busy": 4.0}) == {"busy": 0.0}


def test_overlapping_waits_are_counted_once():
    now = [0.0]
    clock = UnionClock(lambda: now[0])
    prompt_wait = clock.running()
    prompt_wait.__enter__()            # t=0: waiting for a prompt
    now[0] = 2.0
    with clock.running():              # t=2..5: a weight load stalls the engine meanwhile
        now[0] = 5.0
        assert clock.seconds() == 5.0  # a running stretch is included
    now[0] = 6.0
    prompt_wait.__exit__(None, None, None)  # t=6: the prompt wait ends
    assert clock.seconds() == 6.0      # not 6 + 3: the sum of the two waits would count t=2..5 twice
    now[0] = 10.0
    assert clock.seconds() == 6.0      # not idle from t=6
    with clock.running():
        now[0] = 11.5
    assert clock.seconds() == 7.5


def test_a_wait_that_raises_still_stops_the_clock():
    now = [0.0]
    clock = UnionClock(lambda: now[0])
    with pytest.raises(TimeoutError), clock.running():
        now[0] = 1.0
        raise TimeoutError
    now[0] = 3.0
    assert clock.seconds() == 1.0

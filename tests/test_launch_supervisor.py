"""The supervisor's verdict on actors that do not answer stats(): one missed call is load, not a hang."""

from __future__ import annotations

import launch.supervisor as supervisor_module
from actors.stats import NoAnswer
from launch.supervisor import FleetSupervisor

MISSED = NoAnswer(error="GetTimeoutError()", dead=False)


def test_an_actor_is_hung_only_after_it_has_not_answered_for_generate_timeout_s(monkeypatch):
    clock = iter([100.0, 105.0, 140.0, 141.0, 200.0])
    monkeypatch.setattr(supervisor_module.time, "monotonic", lambda: next(clock))
    supervisor = FleetSupervisor(service=None, fleet=None, generate_timeout_s=30.0)
    answered = object()  # any ActorStats

    assert supervisor._note_unanswered({"a": MISSED, "b": answered}) == {"a": 0.0}
    assert supervisor._note_unanswered({"a": MISSED, "b": MISSED}) == {"a": 5.0, "b": 0.0}
    # 'a' has not answered for 40 s now; 'b' answered in between and starts over when it misses again
    assert supervisor._note_unanswered({"a": MISSED, "b": answered}) == {"a": 40.0}
    assert supervisor._note_unanswered({"a": answered, "b": MISSED}) == {"b": 0.0}
    assert supervisor._note_unanswered({"a": MISSED, "b": MISSED}) == {"a": 0.0, "b": 59.0}

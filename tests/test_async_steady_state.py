"""Asynchronous mode in steady state (issue 14): a real tiny RL run, 2 vLLM actors on Ray, η = 1,
30 steps, the default config. Stale drops are rare (at most 5 % of the groups trained on) and lose
nothing: the lease budget keeps both actors within η + 1 batches of the learner, an actor η versions
behind gets no lease, the queue trains the oldest version first, and a re-issued lease waits for the
ack of the actor's dropped copy. Every group trained on is at most η versions behind (the per-step
histogram says so), and each step's metrics carry the actors' time shares from their heartbeats.
Before those three, 4 to 8 groups a run were dropped here (CI among them); without the actors' engine
warm-up, a late-starting actor's first batch arrived 15 versions late.

The learner shares no memory with the actors here, as with actors on other hosts: each version
reaches one actor from the learner and the other through that actor's relay (actors/weights/relay.py),
so the learner sends each version once, and the relay keeps the steady state stale-free too."""

from __future__ import annotations

import pytest
from reliability_helpers import check_run, final_history, run_with_fleet, tiny_run
from wire_helpers import wait_until

pytestmark = pytest.mark.slow  # Ray and vLLM actors

STEPS = 30
MAX_STALENESS = 1
MAX_STALE_FRACTION = 0.05  # of the groups trained on (6 of 120)


def test_two_async_actors_rarely_drop_a_stale_group_and_train_within_eta_versions(ray_session, tmp_path):
    run = tiny_run(tmp_path / "run", steps=STEPS, checkpoint_every=STEPS,
                   overrides=[f"rollout.max_staleness={MAX_STALENESS}", "rollout.lease_seconds=60",
                              "server.weight_shared_memory=false"])
    # steady state is both actors at work: wait until both registered (on a loaded machine one engine may
    # start tens of seconds after the other, and the first did all 30 steps alone; seen in CI)
    done = run_with_fleet(run, num_actors=2, ready=lambda loop: wait_until(
        lambda: len(loop.service.actors_status()) == 2, 300.0, "both actors registered"))
    loop, accounting, metrics, stats = done.loop, done.accounting, done.metrics, done.stats

    check_run(accounting, final_history(done.entries), STEPS)
    # A stale drop loses nothing (its prompt is leased again and trained: check_run counts every prompt
    # once) but wastes a group. The lease budget makes drops rare, not impossible: a group one actor leased
    # can be overtaken by groups its peer leased later and delivered first, and nothing orders arrivals
    # (rollout.late_group_wait_s would hold the step for it; off by default). Idle, 0 in 30 steps; in CI on
    # a loaded 2-core machine 0 in most runs, 4 (actor-1's first groups) and 1 (version 25) in two.
    stale = loop.service.stale_report()
    assert accounting["groups_stale"] <= MAX_STALE_FRACTION * accounting["groups_consumed"], stale
    assert len({g[1] for entry in done.entries for g in entry["groups"]}) == 2, "one actor did all the work"
    for step, values in metrics.items():
        histogram = {int(k.split("/")[1]): v for k, v in values.items() if k.startswith("staleness_groups/")}
        assert sum(histogram.values()) == values["num_groups"], (step, histogram)
        assert max(k for k, v in histogram.items() if v) <= MAX_STALENESS, (step, histogram)
    # the actors' time shares reach the step metrics (heartbeats every 0.5 s): both actors report, every
    # share is a fraction, and one is seen sampling. (Each step samples the last heartbeat of each
    # actor, so an actor whose sampling fell between those samples shows 0 at every step: a suite saw it
    # when the 30 steps took 16 s. That both sampled is what their own counters say.)
    busiest: dict[str, float] = {}
    for values in metrics.values():
        for key, value in values.items():
            if key.startswith("actor_") and "_fraction" in key:
                assert 0 <= value <= 1, (key, value)
            if key.startswith("actor_busy_fraction/"):
                busiest[key] = max(busiest.get(key, 0.0), value)
    assert len(busiest) == 2 and max(busiest.values()) > 0, busiest
    assert all(s.generate_seconds > 0 and s.groups_sent > 0 for s in stats.values()), stats
    assert "actor_lease_wait_fraction" in metrics[STEPS]
    assert all(getattr(s, "tokens_aborted", 0) == 0 for s in stats.values())  # drained, never aborted
    sources = [s.weight_sources for s in stats.values()]
    fetched = sum(f["streamed"] + f["relayed"] for f in sources)
    relayed = sum(f["relayed"] for f in sources)
    # the learner counts the relay answers it gave, the actors the relayed fetches they finished: an
    # actor stopped at the end of the run may have one answer in hand and its fetch unfinished (seen
    # once on a loaded machine: 12 finished, 13 given). The count is read after the fleet stopped: the
    # actors fetch the final version after the loop returned its accounting (CI: 23 finished, 22 then given)
    given = loop.service.accounting()["weight_fetches_relayed"]
    assert 0 < relayed <= given <= relayed + len(stats), (given, sources)
    assert not any(f["shared"] for f in sources), sources
    # A relay may fail a fetch, never change it: the fetch is then streamed by the learner, counted, and the
    # egress bound below still holds. Seen once in CI (2026-12-03, the suite's other worker busy): actor-1
    # had begun staging its next fetch when actor-0 asked it for the version before, which it no longer
    # relays (NOT_FOUND). Such fallbacks stay rare: fewer than the fetches relays carried.
    assert sum(f["relay_failed"] for f in sources) < relayed, sources
    # a version both actors fetch leaves the learner once: its egress stays one copy per version fetched
    versions = set().union(*(s.versions_applied for s in stats.values()))
    version_bytes = loop.service._desk.held().header.total_bytes
    assert accounting["weight_bytes_streamed"] <= 1.5 * len(versions) * version_bytes
    print(f"\nasync steady state: {STEPS} steps, 2 actors, η = {MAX_STALENESS}: stale {accounting['groups_stale']} "
          f"{stale['causes']}, consumed {accounting['groups_consumed']}; weight fetches {fetched}, relayed {relayed}, "
          f"learner egress {accounting['weight_bytes_streamed'] / version_bytes:.1f} versions for {len(versions)} "
          "versions applied")

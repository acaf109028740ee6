"""Actor failures during a real tiny RL run (learner + RL loop here, 2 vLLM actors and a reward
worker on Ray, FleetSupervisor): one actor SIGKILLed (dead for Ray), one SIGSTOPped (silent for the
learner), one whose engine hangs in generate (heartbeats go on). Each is detected and replaced by a
fresh actor that fetches the current weights before sampling; the prompts they had leased are
re-issued when the leases expire; the run completes with every group consumed once and the
accounting balanced."""

from __future__ import annotations

import time

import pytest
import ray
from actors_helpers import wait_for
from ray.exceptions import RayActorError
from reliability_helpers import (
    GENERATE_TIMEOUT_S,
    StepLog,
    check_run,
    final_history,
    freeze_actor,
    hang_engine,
    kill_actor,
    learner_with_fleet,
    tiny_run,
)

from actors.stats import ActorStats
from launch.supervisor import FleetSupervisor

pytestmark = pytest.mark.slow  # Ray, vLLM and injected faults

STEPS = 10


def test_dead_silent_and_hung_actors_are_replaced_and_nothing_is_lost(ray_session, tmp_path):
    run = tiny_run(tmp_path / "run", steps=STEPS, checkpoint_every=STEPS)
    with learner_with_fleet(run, num_actors=2) as rig:
        loop, fleet = rig.loop, rig.fleet
        supervisor = FleetSupervisor(loop.service, fleet, generate_timeout_s=GENERATE_TIMEOUT_S, interval_s=0.5,
                                     call_timeout_s=10.0).start()
        faults: dict[str, tuple[str, int, float]] = {}  # kind -> (actor id, weight version then, time)

        def sampling_actor() -> str | None:
            """A live actor the learner hears from and that has sampled (not one still starting)."""
            live = set(ray.get(fleet.actors.remote()))
            return next((a.actor_id for a in loop.service.actors_status()
                         if a.actor_id in live and not a.stale and a.tokens_per_second > 0
                         and a.actor_id not in {f[0] for f in faults.values()}), None)

        def inject(kind, fault):
            def hook() -> None:
                for _ in range(3):  # the supervisor may replace the chosen actor meanwhile: choose again
                    actor_id = wait_for(sampling_actor, what="an actor that samples")
                    try:
                        fault(fleet, actor_id)
                        break
                    except (RayActorError, KeyError):  # died or already replaced
                        continue
                faults[kind] = (actor_id, loop.version, time.time())
            return hook

        steps = StepLog(loop, hooks={2: inject("dead", kill_actor), 4: inject("silent", freeze_actor),
                                     6: inject("hung", hang_engine)})
        started = time.monotonic()
        try:
            accounting = loop.run(on_step=steps)
            # the healthy actors may finish the run before the hung one is found: give the supervisor time
            replaced_ids = lambda: {r.actor_id for r in supervisor.report.replacements}  # noqa: E731
            wait_for(lambda: {a for a, _, _ in faults.values()} <= replaced_ids(), timeout=GENERATE_TIMEOUT_S + 30,
                     what="every faulty actor replaced")
        finally:
            report = supervisor.stop()
    stats = rig.stats
    wall_s = time.monotonic() - started

    assert loop.step == STEPS
    check_run(accounting, final_history(steps.entries), STEPS)
    replaced = {r["actor_id"]: r for r in report["replacements"]}
    for kind, (actor_id, version, _) in faults.items():
        assert actor_id in replaced, (kind, actor_id, report)
        assert replaced[actor_id]["reason"] == kind, (kind, replaced[actor_id])
        new_id = replaced[actor_id]["replacement_id"]
        if isinstance(stats.get(new_id), ActorStats):
            # the replacement caught up to the learner before it sampled anything
            assert stats[new_id].versions_applied[0] >= version, stats[new_id]
    assert set(faults) == {"dead", "silent", "hung"}
    # the hung actor's leased prompts came back through lease expiry
    assert accounting["prompts_reissued"] >= 1, accounting
    # every actor, the replacements added mid-run included, got its versions over shared memory: the
    # learner streamed less than one version in all (headers, paths and commits), and wrote each once
    assert accounting["weight_bytes_streamed"] < accounting["weight_bytes_shared"] / (STEPS + 1), accounting
    detect = {kind: replaced[a]["at"] - t for kind, (a, _, t) in faults.items()}
    print(f"\nactor faults: {len(faults)} injected, {report['replaced']} replaced in "
          + ", ".join(f"{k} {v:.1f}s" for k, v in detect.items())
          + f"; groups consumed {accounting['groups_consumed']}, lost 0, duplicate {accounting['groups_duplicate']}"
          + f", stale {accounting['groups_stale']}, invalid {accounting['groups_invalid']}"
          + f", prompts re-issued {accounting['prompts_reissued']}; run {wall_s:.0f}s")

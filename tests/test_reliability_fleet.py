"""The fleet's own failure handling: an actor that dies right after every restart is restarted with
growing back-off, then its slot is given up and the RL loop stops with the reason (instead of
waiting for groups that never come); and a detached fleet whose driver is gone shuts itself and its
reward workers down after orphan_timeout_s (or at once with `python -m actors.fleet --close`)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import ray
from actors_helpers import wait_for
from config_helpers import actor_config, loop_config, service_config
from ray.exceptions import RayActorError

from actors.config import RestartPolicy
from actors.fleet import find_named_fleet, start_named_fleet
from launch.supervisor import FleetSupervisor
from learner.rl_loop import NoRolloutsError, RLLoop
from learner.service.prompt_source import Prompt, PromptSource
from learner.service.server import LearnerService
from rewards.pool import RewardPool, RewardSpec, WeightedReward

pytestmark = pytest.mark.slow  # Ray, vLLM and injected faults

ROOT = Path(__file__).resolve().parents[1]
BACKOFF_S = 1.0
MAX_QUICK_FAILURES = 3


def detached_reward_worker():
    """One reward worker that outlives its pool, as a run's fleet holds them."""
    [worker] = RewardPool(RewardSpec(functions=[WeightedReward(ref="exact_match")]), 1,
                          actor_options={"lifetime": "detached"}).handles()
    return worker


def test_a_crash_looping_actor_backs_off_is_given_up_and_the_run_stops_with_the_reason(ray_session, tmp_path):
    # an engine that cannot start: every RolloutActor dies in its constructor, seconds after its spawn
    config = actor_config(tmp_path / "no-such-model", num_cpus=0)
    policy = RestartPolicy(backoff_s=BACKOFF_S, backoff_max_s=30, stable_after_s=300,
                           max_quick_failures=MAX_QUICK_FAILURES)
    fleet = start_named_fleet(config, "127.0.0.1:1", [], 1, name="crash-loop-test", restart=policy)
    service = LearnerService(PromptSource([Prompt([1, 2], "p")]),
                             service_config(group_size=2))
    # the loop stops before any update, so the trainer is only asked how many rows its batches come in
    # multiples of
    no_trainer = SimpleNamespace(rl_row_multiple=lambda row_tokens: 1)
    loop = RLLoop(no_trainer, service, None, None, loop_config(["train.steps=1", "train.prompts_per_step=1"],
                                                               group_size=2, max_sequence_len=16), pad_id=0)
    supervisor = FleetSupervisor(service, fleet, interval_s=0.2, on_fatal=loop.abort).start()
    started = time.monotonic()
    try:
        with pytest.raises(NoRolloutsError, match="every rollout actor slot was given up"):
            loop.run()
        aborted_s = time.monotonic() - started
    finally:
        report = supervisor.stop()
        health = ray.get(fleet.health.remote())
        ray.get(fleet.close.remote())
        ray.kill(fleet)

    deaths = [r for r in report["replacements"] if r["reason"] == "dead"]
    delayed_starts = [r for r in report["replacements"] if r["reason"] == "backoff"]
    # actor-0 died: replaced at once by actor-1; actor-1 and actor-2 died quickly: each replacement
    # waited out a back-off (1 s, then 2 s); actor-3 was the fourth quick death: its slot was given up
    assert [r["actor_id"] for r in deaths] == ["actor-0", "actor-1", "actor-2", "actor-3"], report
    assert [r["replacement_id"] for r in deaths] == ["actor-1", "", "", ""], report
    assert [r["replacement_id"] for r in delayed_starts] == ["actor-2", "actor-3"], report
    for (death, start), backoff in zip(zip(deaths[1:3], delayed_starts, strict=True), (BACKOFF_S, 2 * BACKOFF_S),
                                       strict=True):
        assert start["at"] - death["at"] >= backoff - 0.05, (death, start)
    assert health.actors == () and health.pending == {}
    [given_up] = health.given_up
    assert given_up.actor_id == "actor-3" and given_up.failures == MAX_QUICK_FAILURES + 1
    assert report["fatal"] and "actor-3" in report["fatal"]
    waits = [round(s["at"] - d["at"], 1) for d, s in zip(deaths[1:3], delayed_starts, strict=True)]
    print(f"\ncrash loop: 4 deaths, back-offs {waits} s, slot given up, run stopped {aborted_s:.0f} s after start")


def test_a_fleet_no_driver_touches_shuts_down_with_its_reward_workers(ray_session, tmp_path):
    worker = detached_reward_worker()
    fleet = start_named_fleet(actor_config(tmp_path), "127.0.0.1:1", [worker], 0,
                              name="orphan-test", run_key="run-a", orphan_timeout_s=2.0)
    # a driver touching it keeps it: 4 s > the timeout
    for _ in range(8):
        time.sleep(0.5)
        ray.get(fleet.touch.remote())
        stopped_touching = time.monotonic()
    assert ray.get(fleet.describe.remote()).run_key == "run-a"
    wait_for(lambda: find_named_fleet("orphan-test") is None, timeout=30, what="the orphaned fleet to exit")
    gone_s = time.monotonic() - stopped_touching
    with pytest.raises(RayActorError):
        ray.get(worker.ready.remote(), timeout=30)
    assert 2.0 <= gone_s < 15, gone_s


def test_the_fleet_cli_closes_a_fleet_a_stopped_run_left_behind(ray_session, tmp_path):
    worker = detached_reward_worker()
    start_named_fleet(actor_config(tmp_path), "127.0.0.1:1", [worker], 0, name="left-behind")
    gcs = ray.get_runtime_context().gcs_address
    cli = [sys.executable, "-m", "actors.fleet", "--close", "--name", "left-behind", "--address", gcs]
    closed = subprocess.run(cli, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert closed.returncode == 0 and closed.stdout.strip() == "closed left-behind", closed.stderr[-2000:]
    assert find_named_fleet("left-behind") is None
    with pytest.raises(RayActorError):
        ray.get(worker.ready.remote(), timeout=30)
    again = subprocess.run(cli, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0 and again.stdout.strip() == "no fleet named 'left-behind'"

"""The driver itself killed: `ray job submit ... launch/rl.py` SIGKILLed mid-run, then submitted again
with the same command, as a user would. The job trains with a user's policy loss (`module:function`).

The rollout actor and the reward worker are detached, so they outlive the killed driver. The second
job resumes from the last checkpoint, re-attaches to the same fleet (the same actor, moved to the
new learner's port), and finishes with every step's groups consumed once and the accounting
balanced; afterwards no tandem actor is left on the cluster.
"""

from __future__ import annotations

import json
import subprocess
import time

import psutil
import pytest
from actors_helpers import wait_for
from ray_head_helpers import BIN, ROOT, submit_command

from learner.rl_loop import RESTART_VERSION_STRIDE

pytestmark = pytest.mark.slow  # Ray, vLLM and injected faults

STEPS, PROMPTS, GROUP, CHECKPOINT_EVERY, KILL_AFTER = 10, 4, 4, 2, 5
TANDEM_ACTOR_CLASSES = {"NamedFleet", "RolloutActor", "RewardWorker"}


def rl_job(ray_head, run_dir, data_dir) -> list[str]:
    return submit_command(
        ray_head, "python", "launch/rl.py", "launch/configs/demo_rl.yaml", f"run_dir={run_dir}",
        f"data.dir={data_dir}", f"train.steps={STEPS}", f"train.prompts_per_step={PROMPTS}",
        f"train.checkpoint_every={CHECKPOINT_EVERY}", f"rollout.group_size={GROUP}", "rollout.prompts_per_batch=4",
        "rollout.queue_capacity=8", "rollout.lease_seconds=10", "rollout.fleet_name=driver-kill-test",
        "optim.warmup_steps=0", "train.eval_every=0", "data.eval_examples=16", "train.compile_ahead=first",
        "train.stop_at=null", "train.stop_at_plateau=null",  # the demo's early end needs evaluations
        # the asynchronous loop (as the demo config is), pinned: groups in flight across the kill
        "rollout.sync=false", "rollout.max_staleness=1",
        # a model from scratch gets no reward: 'fill' would retire every group and train on none
        "algo.dynamic_sampling=off",
        # a user's policy loss, from a file of the job's working dir (not registered anywhere); every step
        # runs it (no reward, so no step would have signal to update on)
        "algo.algorithm=tests.user_policy_loss:reinforce", "algo.loss_kwargs={scale: 2.0}",
        "train.skip_no_signal=false")


def driver_processes(run_dir) -> list[psutil.Process]:
    """The job's Python driver: `python launch/rl.py ... run_dir=...` (not `ray job submit`, nor a shell)."""
    found = []
    for p in psutil.process_iter(["cmdline"]):
        command = p.info["cmdline"] or []
        if command[1:2] == ["launch/rl.py"] and f"run_dir={run_dir}" in command:
            found.append(p)
    return found


def steps_logged(run_dir) -> int:
    metrics = run_dir / "tb" / "metrics.jsonl"
    return metrics.read_text().count("\n") if metrics.exists() else 0


def alive_tandem_actors(ray_head) -> list[str]:
    probe = ("import json, sys; from ray.util.state import list_actors; "
             "print(json.dumps([a.class_name for a in list_actors(address=sys.argv[1], "
             "filters=[('state', '=', 'ALIVE')], limit=1000)]))")
    out = subprocess.run([str(BIN / "python"), "-c", probe, ray_head.dashboard], env=ray_head.env,
                         capture_output=True, text=True, timeout=120, check=True)
    return [name for name in json.loads(out.stdout.strip().splitlines()[-1]) if name in TANDEM_ACTOR_CLASSES]


def test_a_killed_driver_resubmitted_reattaches_to_its_actors_and_loses_nothing(ray_head, tmp_path):
    run_dir, data_dir = tmp_path / "rl", tmp_path / "data"
    with (tmp_path / "job1.log").open("w") as log:
        first = subprocess.Popen(rl_job(ray_head, run_dir, data_dir), env=ray_head.env, stdout=log,
                                 stderr=subprocess.STDOUT, cwd=ROOT)
    try:
        # past a committed checkpoint (orbax renames a checkpoint's dir to its step once it is durable)
        wait_for(lambda: steps_logged(run_dir) >= KILL_AFTER and (run_dir / "checkpoints" / "4").is_dir(),
                 timeout=600, what=f"step {KILL_AFTER} and the step-4 checkpoint")
        [driver] = wait_for(lambda: driver_processes(run_dir), timeout=30, what="the driver process")
        driver.kill()  # SIGKILL: no finally, no clean shutdown
        killed_at, steps_before = time.monotonic(), steps_logged(run_dir)
        assert first.wait(120) != 0, "the first job should fail: its driver was killed"
    finally:
        if first.poll() is None:
            first.kill()
    assert steps_before < STEPS
    assert sorted(alive_tandem_actors(ray_head)) == ["NamedFleet", "RewardWorker", "RolloutActor"]

    second = subprocess.run(rl_job(ray_head, run_dir, data_dir), env=ray_head.env, capture_output=True,
                            text=True, timeout=900, cwd=ROOT)
    finished_s = time.monotonic() - killed_at
    assert second.returncode == 0, second.stdout[-4000:] + second.stderr[-4000:]

    summary = json.loads((run_dir / "summary.json").read_text())
    accounting = summary["accounting"]
    steps = [json.loads(line) for line in (run_dir / "tb" / "metrics.jsonl").read_text().splitlines()]
    assert {s.get("reinforce_scale") for s in steps} == {2.0}  # the user's loss computed every step
    assert summary["fleet"] == {"name": "driver-kill-test", "reattached": True}
    assert summary["steps"] == STEPS and summary["accounting_violations"] == []
    assert accounting["groups_consumed"] == STEPS * PROMPTS, accounting
    # groups the killed run leased after its last checkpoint come back stale, not invalid
    assert accounting["groups_invalid"] == 0, accounting
    # the restored learner published under a fresh version and counted up to the last step from there
    assert summary["weight_version"] == RESTART_VERSION_STRIDE + STEPS
    # one actor served both drivers: versions of the killed run, then the restored run's
    (actor_id, actor), = summary["actors"].items()
    applied = actor["versions_applied"]
    said = [line for line in (second.stdout + second.stderr).splitlines() if "rollout actor" in line]
    assert actor_id == "actor-0" and summary["supervisor"]["replaced"] == 0, (summary["supervisor"], said[-20:])
    # (the last version, published by the last step, may reach it after the run read its stats)
    assert any(v < RESTART_VERSION_STRIDE for v in applied)
    assert RESTART_VERSION_STRIDE < applied[-1] <= RESTART_VERSION_STRIDE + STEPS, applied
    assert alive_tandem_actors(ray_head) == [], "the finished run left actors behind"
    restored = min(v for v in applied if v >= RESTART_VERSION_STRIDE) - RESTART_VERSION_STRIDE
    assert 4 <= restored < steps_before, (restored, steps_before)
    print(f"\ndriver kill: killed after step {steps_before}, resumed from step {restored} with the same actor "
          f"({actor_id}), run finished {finished_s:.0f} s after the kill; consumed {accounting['groups_consumed']}"
          f", lost 0, duplicate {accounting['groups_duplicate']}, stale {accounting['groups_stale']}, invalid "
          f"{accounting['groups_invalid']}, prompts re-issued {accounting['prompts_reissued']}")

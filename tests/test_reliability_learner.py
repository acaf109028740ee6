"""Learner failure: the learner (trainer + service + RL loop, a subprocess driver on a fixed port) is
SIGKILLed mid-run, while its rollout actor serves a weight version newer than the last checkpoint,
and started again. It resumes from the checkpoint; the same actor reconnects, re-registers,
re-sends its unacknowledged groups, moves to the learner's restored weights (published under a fresh
version number, above every version of the crashed run), and the run finishes with every step's
groups consumed once and the accounting balanced."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from reliability_helpers import (
    check_run,
    final_history,
    free_port,
    read_steps,
    start_fleet,
    stop_fleet,
    tiny_run,
)

from learner.rl_loop import RESTART_VERSION_STRIDE

pytestmark = pytest.mark.slow  # Ray, vLLM and injected faults

STEPS = 10
CHECKPOINT_EVERY = 2
HOLD_AT = 5  # odd: the actor then serves a version newer than the last checkpoint
DRIVER = Path(__file__).with_name("reliability_helpers.py")


def start_driver(run_dir: Path, port: int, log_name: str, hold_at: int = 0) -> subprocess.Popen:
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    env.pop("XLA_FLAGS", None)  # one device is enough for the tiny learner
    log = (run_dir / log_name).open("w")
    return subprocess.Popen([sys.executable, str(DRIVER), str(run_dir), str(port), str(STEPS),
                             str(CHECKPOINT_EVERY), str(hold_at)], stdout=log, stderr=subprocess.STDOUT, env=env)


def wait_until(predicate, timeout: float, what: str, poll_s: float = 0.05):
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(poll_s)
    return value


def test_learner_killed_mid_run_resumes_and_actors_reconnect(ray_session, tmp_path):
    run_dir = tmp_path / "run"
    port = free_port()
    run = tiny_run(run_dir, steps=STEPS, checkpoint_every=CHECKPOINT_EVERY, port=port)  # model + data once
    starts, steps_log = run_dir / "starts.jsonl", run_dir / "steps.jsonl"
    first = start_driver(run_dir, port, "driver1.log", hold_at=HOLD_AT)
    pool = fleet = second = None
    try:
        wait_until(starts.exists, 180, "the learner to serve", poll_s=0.2)
        pool, fleet = start_fleet(run, f"127.0.0.1:{port}", num_actors=1)
        # the learner holds after step 5 once the actor serves version 5; its last checkpoint is step 4
        held = json.loads(wait_until(lambda: (run_dir / "held").exists() and (run_dir / "held").read_text(),
                                     300, "the learner to hold with the actor on its version", poll_s=0.2))
        held, held_step = held["version"], held["step"]
        first.send_signal(signal.SIGKILL)
        first.wait(30)
        killed_at = time.monotonic()
        steps_before = read_steps(steps_log)[-1]["step"]
        second = start_driver(run_dir, port, "driver2.log")
        try:
            code = second.wait(300)
        except subprocess.TimeoutExpired:
            code = "none after 300 s"
        assert code == 0, (f"relaunched driver: exit {code}\n{(run_dir / 'driver2.log').read_text()[-2000:]}\n"
                           f"{(run_dir / 'debug.log').read_text()[-3000:]}")
        resumed_s = time.monotonic() - killed_at
    finally:
        for driver in (first, second):
            if driver is not None and driver.poll() is None:
                driver.kill()
        stats = stop_fleet(pool, fleet) if fleet is not None else {}

    summary = json.loads((run_dir / "summary.json").read_text())
    restart = [json.loads(line) for line in starts.read_text().splitlines()][-1]
    history = final_history(read_steps(steps_log))
    accounting = summary["accounting"]
    assert summary["violations"] == [] and summary["step"] == STEPS
    check_run(accounting, history, STEPS)
    # it resumed from a checkpoint older than what the actor served, and redid the steps after it;
    # the restored weights got a version above anything the crashed run published
    assert restart["step"] < held_step and restart["step"] <= steps_before, (restart, held_step)
    assert restart["version"] == restart["step"] + RESTART_VERSION_STRIDE > held, (restart, held)
    (actor_id, actor), = stats.items()
    # the same actor moved to the restored weights, and kept sampling for the restarted learner
    applied = actor.versions_applied
    assert restart["version"] in applied[applied.index(held):], (applied, restart)
    redone = [g for step, entry in history.items() if step > restart["step"] for g in entry["groups"]]
    assert redone and all(actor_id == g[1] for g in redone)
    print(f"\nlearner kill: killed after step {steps_before} (actor on version {held}), resumed from step "
          f"{restart['step']} version {restart['version']}, run finished {resumed_s:.0f}s after the kill; "
          f"consumed {accounting['groups_consumed']}, lost 0, duplicate {accounting['groups_duplicate']}, "
          f"invalid {accounting['groups_invalid']}, forgotten on restart "
          f"{accounting['groups_forgotten_on_restart']}, prompts re-issued {accounting['prompts_reissued']}; "
          f"actor versions {applied}")

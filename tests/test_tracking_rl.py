"""Runs through launch's modes with trackers on. An RL job (`python launch/rl.py`: real learner, gRPC, a
vLLM actor on the session's Ray, the reward pool) with `logging.wandb.mode=offline` and
`logging.trackio.enabled`: W&B's offline run and trackio's local store hold every step's metrics as
metrics.jsonl has them (the learner's loss and reward, the actors' tok/s and time shares, staleness), the
resolved config without the token, and curves.png at the last step. The job is a process of its own so
that it can run in trackio's environment (tracking_helpers.trackio_env: trackio and its pillow<13 from
.trackio-site, `make trackio-env`). A pretraining run whose W&B cannot start (online, no API key): it
finishes, with a warning. The trackers alone, one that breaks or hangs: tests/test_tracking.py."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest
from reliability_helpers import TINY_MODEL, read_steps, tiny_overrides
from tracking_helpers import (
    HAS_TRACKIO,
    ROOT,
    needs_trackio,
    trackio_env,
    trackio_picture,
    trackio_run,
    wandb_config,
    wandb_history,
    wandb_offline_run,
)

from launch.config import load_config
from launch.run import close_debug_log, prepare
from launch.stages import run_mode

pytestmark = pytest.mark.slow  # Ray, a vLLM actor; a pretraining run

STEPS = 3
PROJECT = "tandem-rl-test"
# every step updates and logs its loss, whatever its rewards; the reward has signal on random weights
EVERY_STEP_UPDATES = ["algo.dynamic_sampling=off", "train.skip_no_signal=false",
                      "rewards.functions=[{ref: format_regex, kwargs: {pattern: '^[0-9]'}}]"]
# what every step logs, beside the loss and reward: the actors' statistics over their last heartbeat window
ACTOR_KEYS = ("actor_tokens_per_s", "actor_busy_fraction", "staleness_mean")


@pytest.fixture(scope="module")
def job(ray_session, tmp_path_factory):
    """(run_dir, summary, metrics.jsonl's records by step) of a STEPS-step RL job with the trackers on:
    `launch/rl.py` joining the session's Ray, in trackio's environment where .trackio-site is."""
    run_dir = tmp_path_factory.mktemp("tracked") / "rl"
    overrides = tiny_overrides(run_dir, steps=STEPS, checkpoint_every=STEPS, overrides=[
        *EVERY_STEP_UPDATES, "rollout.fleet_name=test-tracking-rl", "logging.wandb.mode=offline",
        "logging.wandb.tags=[test]", f"logging.trackio.enabled={str(HAS_TRACKIO).lower()}",
        f"logging.trackio.project={PROJECT}"])
    env = {**(trackio_env() if HAS_TRACKIO else os.environ),
           "RAY_ADDRESS": ray_session.get_runtime_context().gcs_address}
    done = subprocess.run([sys.executable, "launch/rl.py", *overrides], env=env, cwd=ROOT, capture_output=True,
                          text=True, timeout=900)
    assert done.returncode == 0, f"{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    summary = json.loads((run_dir / "summary.json").read_text())
    records = {r["step"]: r for r in read_steps(run_dir / "tb" / "metrics.jsonl")}
    return run_dir, summary, records


def check_steps(history: dict[int, dict], records: dict[int, dict]) -> None:
    """Every step's every metric, under metrics.jsonl's (TensorBoard's) names, with its value."""
    assert sorted(records) == list(range(1, STEPS + 1))
    for step, record in records.items():
        assert {"loss", "reward_mean", *ACTOR_KEYS} <= record.keys()
        for name, value in record.items():
            if name != "step" and isinstance(value, float | int) and math.isfinite(value):
                assert history[step][name] == pytest.approx(value, rel=1e-12), (step, name)


def test_wandb_offline_run_holds_every_step_the_config_and_the_curves(job):
    run_dir, summary, records = job
    assert summary["steps"] == STEPS
    wandb_run = wandb_offline_run(run_dir)
    history = wandb_history(wandb_run)
    check_steps(history, records)
    config = wandb_config(wandb_run)
    assert config["train"]["steps"] == STEPS and config["logging"]["wandb"]["mode"] == "offline"
    assert "auth_token" not in config["server"]
    assert history[STEPS]["curves/_type"] == "image-file"
    assert (wandb_run / "files" / history[STEPS]["curves/path"]).is_file()
    shown = ("loss", "reward_mean", *ACTOR_KEYS)
    print("\nW&B: " + json.dumps({step: {k: history[step][k] for k in shown} for step in records}))


@needs_trackio
def test_trackio_store_holds_every_step_the_config_and_the_curves(job, tmp_path):
    run_dir, _, records = job
    history, config = trackio_run(tmp_path, PROJECT, run_dir.name)
    check_steps(history, records)
    assert config["train"]["steps"] == STEPS and "auth_token" not in config["server"]
    assert history[STEPS]["curves"]["_type"] == "trackio.image"
    assert trackio_picture(history[STEPS]["curves"]) == (run_dir / "curves.png").read_bytes()


def test_a_run_whose_wandb_cannot_start_finishes_with_a_warning(tmp_path, monkeypatch):
    """W&B online with no API key: its init raises (W&B's own UsageError, at once); the run trains every
    step, writes its summary, and says why W&B is missing. The server address is a closed loopback port,
    so nothing leaves the machine even where a key is configured."""
    for name, value in {"WANDB_CONFIG_DIR": str(tmp_path / "wandb-config"), "NETRC": str(tmp_path / "no.netrc"),
                        "WANDB_BASE_URL": "http://127.0.0.1:9"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    data = tmp_path / "text.jsonl"
    data.write_text("".join(json.dumps({"text": f"{a}+{a}={2 * a}"}) + "\n" for a in range(10, 60)))
    run = prepare(load_config(None, [f"run_dir={tmp_path / 'pretrain'}", f"data.train={data}", "mesh.fsdp=1",
                                     *TINY_MODEL, "data.seq_len=16", "train.batch_size=4", f"train.steps={STEPS}",
                                     f"train.checkpoint_every={STEPS}", "logging.wandb.mode=online"]), "pretrain")
    try:
        summary = run_mode(run, "pretrain")
    finally:
        close_debug_log()
    assert summary["steps"] == STEPS and (run.run_dir / "summary.json").is_file()
    assert [r["step"] for r in read_steps(run.run_dir / "tb" / "metrics.jsonl")] == list(range(1, STEPS + 1))
    assert "tracker wandb could not start (UsageError: " in (run.run_dir / "debug.log").read_text()

"""Experiment trackers (learner/tracking, launch/tracking.py): off by default; W&B offline and trackio's
local store hold every step under TensorBoard's names, the resolved config once and the pictures; a
tracker that cannot start, breaks or hangs never stops or slows the run. The RL job end to end:
tests/test_tracking_rl.py."""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from pathlib import Path

from tracking_helpers import (
    TRACKIO_SITE,
    in_trackio_env,
    needs_trackio,
    trackio_picture,
    trackio_run,
    wandb_config,
    wandb_history,
    wandb_offline_run,
)

from launch.config import load_config
from launch.demo import stage_overrides
from launch.tracking import tracked_config
from learner.metrics import MetricsWriter
from learner.tracking.config import LoggingConfig, open_trackers
from learner.tracking.tracker import BackgroundTracker

FIGURE = Path(__file__).resolve().parents[1] / "launch" / "figures" / "demo.png"
STEPS = {1: {"loss": 2.5, "reward_mean": 0.25, "eval/pass@1_greedy": 0.125, "actor_tokens_per_s": 310.0},
         2: {"loss": 2.0, "reward_mean": 0.5, "actor_tokens_per_s": 290.0},
         3: {"loss": math.nan, "reward_mean": 0.75, "actor_tokens_per_s": 305.0}}


class Recorder:
    """A tracker that records its calls (and can be told to fail at a step)."""

    def __init__(self, fail_at: int | None = None):
        self.calls: list[tuple] = []
        self.fail_at = fail_at

    def log(self, step, scalars):
        if step == self.fail_at:
            raise ConnectionError("lost the tracker's server")
        self.calls.append(("log", step, dict(scalars)))

    def image(self, step, name, path):
        self.calls.append(("image", step, name, path))

    def close(self):
        self.calls.append(("close",))


def write_steps(writer: MetricsWriter) -> None:
    for step, metrics in STEPS.items():
        writer.write(step, metrics)


def jsonl_steps(logdir: Path) -> list[int]:
    return [json.loads(line)["step"] for line in (logdir / "metrics.jsonl").read_text().splitlines()]


def same(a: float, b: float) -> bool:
    return a == b or (math.isnan(a) and math.isnan(b))


def test_trackers_are_off_by_default_and_the_tracked_config_leaves_the_token_out(monkeypatch):
    monkeypatch.setenv("TANDEM_AUTH_TOKEN", "s3cret")
    config = load_config(None)
    assert config.logging.wandb.mode == "disabled" and not config.logging.trackio.enabled
    assert open_trackers(config.logging, name="run", config={}, run_dir=Path(".")) == []
    tracked = tracked_config(config)
    assert config.server.auth_token == "s3cret" and "auth_token" not in tracked["server"]
    assert "s3cret" not in json.dumps(tracked)
    assert tracked["train"]["steps"] == config.train.steps and tracked["logging"]["wandb"]["mode"] == "disabled"


def test_the_demo_hands_logging_overrides_to_every_stage(tmp_path):
    args = type("Args", (), {"run_dir": str(tmp_path), "seed": 3, "quick": False,
                             "overrides": ["logging.wandb.mode=offline", "rl.train.steps=7"]})()
    assert "logging.wandb.mode=offline" in stage_overrides(args, "pretrain", None)
    assert {"logging.wandb.mode=offline", "train.steps=7"} <= set(stage_overrides(args, "rl", "hf"))
    assert "train.steps=7" not in stage_overrides(args, "sft", None)


def test_the_writer_hands_every_step_and_the_end_to_each_tracker(tmp_path):
    recorder = Recorder()
    with MetricsWriter(tmp_path, trackers=[BackgroundTracker("recorder", lambda: recorder)]) as writer:
        write_steps(writer)
        writer.report(3, {"eval_final/pass@1_greedy": 0.5}, {"curves": FIGURE})
    logged = [c for c in recorder.calls if c[0] == "log"]
    assert [step for _, step, _ in logged] == [1, 2, 3, 3]
    for (_, step, scalars) in logged[:3]:
        assert scalars.keys() == STEPS[step].keys() and all(same(scalars[k], v) for k, v in STEPS[step].items())
    assert logged[3][2] == {"eval_final/pass@1_greedy": 0.5}
    assert recorder.calls[-2:] == [("image", 3, "curves", FIGURE), ("close",)]
    assert jsonl_steps(tmp_path) == [1, 2, 3]


def test_a_tracker_whose_start_raises_is_dropped_with_a_warning_and_the_run_goes_on(tmp_path, caplog):
    def start():
        raise ConnectionError("W&B is unreachable")

    tracker = BackgroundTracker("broken", start)
    with caplog.at_level(logging.WARNING), MetricsWriter(tmp_path, trackers=[tracker]) as writer:
        write_steps(writer)
    assert tracker.failed and jsonl_steps(tmp_path) == [1, 2, 3]
    assert "tracker broken could not start (ConnectionError: W&B is unreachable); the run continues" in caplog.text


def test_a_tracker_that_breaks_mid_run_is_closed_and_dropped(tmp_path, caplog):
    recorder = Recorder(fail_at=2)
    tracker = BackgroundTracker("flaky", lambda: recorder)
    with caplog.at_level(logging.WARNING), MetricsWriter(tmp_path, trackers=[tracker]) as writer:
        writer.write(1, STEPS[1])
        writer.write(2, STEPS[2])
        deadline = time.monotonic() + 10
        while not tracker.failed and time.monotonic() < deadline:
            time.sleep(0.01)
        writer.write(3, STEPS[3])
    assert [c[:2] for c in recorder.calls] == [("log", 1), ("close",)]
    assert tracker.dropped == 1 and jsonl_steps(tmp_path) == [1, 2, 3]
    assert "tracker flaky failed (ConnectionError: lost the tracker's server)" in caplog.text


def test_a_hung_tracker_never_slows_a_step_and_is_left_behind_at_the_end(tmp_path, caplog):
    """A start that never returns (a server that accepts and never answers): steps do not wait, the calls
    past the queue's capacity are dropped, and closing waits close_timeout_s, not forever."""
    release = threading.Event()
    tracker = BackgroundTracker("hung", lambda: release.wait() and Recorder(), capacity=2, close_timeout_s=0.5)
    try:
        with caplog.at_level(logging.WARNING):
            writer = MetricsWriter(tmp_path, trackers=[tracker])
            started = time.monotonic()
            for step in range(1, 6):
                writer.write(step, STEPS[1])
            writing = time.monotonic() - started
            started = time.monotonic()
            writer.close()
            closing = time.monotonic() - started
    finally:
        release.set()
    assert writing < 0.5 and tracker.dropped == 3  # 5 steps, 2 queued
    assert 0.4 < closing < 5.0
    assert "tracker hung is not keeping up (2 calls queued)" in caplog.text
    assert "tracker hung did not finish within 0 s; left behind" in caplog.text
    assert jsonl_steps(tmp_path) == [1, 2, 3, 4, 5]


def check_history(history: dict[int, dict], config: dict) -> None:
    """`history` holds STEPS under their own names, the final score and the picture at the last step."""
    for step, metrics in STEPS.items():
        assert all(same(history[step][name], value) for name, value in metrics.items()), (step, history[step])
    assert history[3]["eval_final/pass@1_greedy"] == 0.5
    assert config == {"train": {"steps": 3}}


def test_wandb_offline_holds_every_step_the_config_and_the_picture(tmp_path):
    logging_config = LoggingConfig.model_validate({"wandb": {"mode": "offline", "tags": ["unit"]}})
    trackers = open_trackers(logging_config, name="unit", config={"train": {"steps": 3}}, run_dir=tmp_path)
    with MetricsWriter(tmp_path / "tb", trackers=trackers) as writer:
        write_steps(writer)
        writer.report(3, {"eval_final/pass@1_greedy": 0.5}, {"curves": FIGURE})
    assert not trackers[0].failed
    run = wandb_offline_run(tmp_path)
    history = wandb_history(run)
    check_history(history, wandb_config(run))
    assert history[3]["curves/_type"] == "image-file" and (run / "files" / history[3]["curves/path"]).is_file()


@needs_trackio
def test_trackio_local_store_holds_every_step_the_config_and_the_picture(tmp_path):
    """The run goes through the project's trackers in trackio's own environment (tracking_helpers): its
    pillow<13 from .trackio-site, not the stack's 13; the store is read back there with trackio's API."""
    spec = {"logging": {"trackio": {"enabled": True, "project": "unit"}}, "name": "unit",
            "config": {"train": {"steps": 3}}, "steps": STEPS, "final_step": 3,
            "final": {"eval_final/pass@1_greedy": 0.5}, "images": {"curves": str(FIGURE)},
            "logdir": str(tmp_path / "tb")}
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    written = in_trackio_env(tmp_path, "write", str(tmp_path / "spec.json"))
    assert written["failed"] == [] and jsonl_steps(tmp_path / "tb") == [1, 2, 3]
    for module in ("pil", "trackio"):
        assert Path(written[module]).is_relative_to(TRACKIO_SITE), written
    assert int(written["pillow"].split(".")[0]) < 13
    history, config = trackio_run(tmp_path, "unit", "unit")
    check_history(history, config)
    assert history[3]["curves"]["_type"] == "trackio.image"
    assert trackio_picture(history[3]["curves"]) == FIGURE.read_bytes()

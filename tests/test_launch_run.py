"""launch/run.py and launch/tasks.py: a run's preparation takes its data from the data-task hook, and
launch/rl_mode.py stops everything it started when a later part fails."""

import os
import socket
import subprocess
import sys
import typing
from pathlib import Path

import pytest
from reliability_helpers import tiny_run

from launch import rl_mode
from launch.config import DataConfig, load_config
from launch.run import prepare
from launch.tasks import DATA_TASKS


def test_every_data_task_the_config_accepts_has_a_generator():
    declared = set(typing.get_args(DataConfig.model_fields["task"].annotation)) - {"none"}
    assert declared == set(DATA_TASKS)


@pytest.mark.parametrize("mode", ["pretrain", "sft", "rl", "eval"])
def test_prepare_takes_the_modes_split_and_the_heldout_split_from_the_task(tmp_path, monkeypatch, mode):
    calls = []

    def fake_task(data_dir: Path, data: DataConfig, seed: int) -> dict[str, Path]:
        calls.append((data_dir, data.digits, seed))
        return {split: data_dir / f"{split}.jsonl" for split in ("pretrain", "sft", "rl", "heldout")}

    monkeypatch.setitem(DATA_TASKS, "arithmetic", fake_task)
    config = load_config(None, [f"run_dir={tmp_path}/run", "data.task=arithmetic", "data.digits=2", "seed=7",
                                "model.tiny.num_layers=1"])
    run = prepare(config, mode)
    data_dir = tmp_path / "run" / "data"
    assert calls == [(data_dir, 2, 7)]
    assert run.train_data == (None if mode == "eval" else str(data_dir / f"{mode}.jsonl"))
    assert run.eval_data == str(data_dir / "heldout.jsonl")


@pytest.mark.parametrize("chosen", [None, "elsewhere"])
def test_entrypoints_cache_compilations_in_home_unless_jax_is_told_another_directory(tmp_path, chosen):
    env = {k: v for k, v in os.environ.items() if k != "JAX_COMPILATION_CACHE_DIR"} | {"HOME": str(tmp_path)}
    if chosen:
        env["JAX_COMPILATION_CACHE_DIR"] = str(tmp_path / chosen)
    code = ("from launch.run import setup_process; setup_process(); import jax; "
            "print(jax.config.jax_compilation_cache_dir)")
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=Path(__file__).resolve().parents[1],
                         capture_output=True, text=True, check=True).stdout.split()[-1]
    assert out == str(tmp_path / (chosen or ".cache/tandem/jax"))


def test_a_failing_rollout_side_stops_the_service_and_the_ray_this_run_started(tmp_path, monkeypatch):
    run = tiny_run(tmp_path, steps=1)
    shutdowns, addresses = [], []
    monkeypatch.setattr(rl_mode.ray_cluster, "connect", lambda address: True)  # as if it started Ray
    monkeypatch.setattr(rl_mode.ray, "shutdown", lambda: shutdowns.append("ray"))

    monkeypatch.setattr(rl_mode, "fleet_enrollment_key", lambda run: None)  # no fleet left behind

    def failing_rollout_side(run, address, enrollment_key):
        addresses.append(address)
        socket.create_connection(tuple(address.rsplit(":", 1)), timeout=5).close()  # serving now
        raise RuntimeError("no actors today")

    monkeypatch.setattr(rl_mode, "open_rollout_side", failing_rollout_side)
    with pytest.raises(RuntimeError, match="no actors today"):
        rl_mode.run_rl_mode(run)
    assert shutdowns == ["ray"]
    with pytest.raises(OSError):  # the learner's gRPC server is gone
        socket.create_connection(tuple(addresses[0].rsplit(":", 1)), timeout=5)

"""Checkpoints: a run killed after checkpointing and resumed in a new process ends with exactly the
parameters of the uninterrupted run; retention, intervals and the JSON state round-trip.

This file is also the worker script of the resume test:
    python tests/test_learner_checkpoint.py {train-then-hang|resume} HF_DIR DATA CKPT_DIR STEPS OUT_DIR
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np
import pytest
from flax import nnx
from learner_train_helpers import addition_texts, host_leaves
from transformers import AutoTokenizer

from launch.json_files import write_jsonl
from learner.algo.optim import OptimizerConfig
from learner.algo.train_step import Trainer
from learner.checkpoint import Checkpointer
from learner.data import DataConfig, DataPosition, make_batches
from models.jax_model import load_model, make_mesh

ROOT = Path(__file__).resolve().parents[1]
FIRST, MORE = 4, 3  # steps before the checkpoint, steps after the restart
EXTRA = {"consumed_group_ids": ["g1", "g7"], "accounting": {"groups_consumed": 2}}


def _trainer_and_batches(hf_dir: Path, data: Path):
    mesh = make_mesh(2, 1)
    optimizer = OptimizerConfig(learning_rate=3e-3, warmup_steps=2, total_steps=FIRST + MORE)
    trainer = Trainer(load_model(hf_dir, mesh=mesh), mesh, optimizer, seed=11)
    config = DataConfig(kind="pretrain", source=str(data), seq_len=32, batch_size=4, seed=5)
    return trainer, make_batches(config, AutoTokenizer.from_pretrained(hf_dir))


def _worker(mode: str, hf_dir: Path, data: Path, ckpt_dir: Path, steps: int, out_dir: Path) -> None:
    trainer, batches = _trainer_and_batches(hf_dir, data)
    checkpointer = Checkpointer(ckpt_dir, max_to_keep=2)
    if mode == "train-then-hang":
        for _ in range(steps):
            trainer.pretrain_step(next(batches))
        checkpointer.save(steps, trainer.state, EXTRA, data_position=batches.position, weight_version=steps)
        checkpointer.wait()
        print("SAVED", flush=True)
        while True:  # keep training (without saving) until killed
            trainer.pretrain_step(next(batches))
            time.sleep(0.05)
    restored = checkpointer.restore(trainer.state)
    restored_step = int(restored.state.step)  # read before the steps donate (delete) these buffers
    trainer.state, batches.position = restored.state, restored.data_position
    for _ in range(steps):
        trainer.pretrain_step(next(batches))
    np.savez(out_dir / "params.npz", *host_leaves(trainer.state.params))
    trainer.export_hf(out_dir / "hf", tokenizer_dir=hf_dir)
    report = {"step": restored.step, "weight_version": restored.weight_version, "extra": restored.extra,
              "state_step": restored_step, "position": batches.position.model_dump()}
    print(json.dumps(report), flush=True)
    checkpointer.close()


def _run_worker(log: Path, *args: object) -> subprocess.Popen:
    """Start a worker; its stderr goes to `log` (a pipe nobody reads could fill up and block it)."""
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": "--xla_force_host_platform_device_count=8",
           "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")])}
    with log.open("w") as stderr:
        return subprocess.Popen([sys.executable, __file__, *map(str, args)], stdout=subprocess.PIPE,
                                stderr=stderr, text=True, env=env, cwd=ROOT)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_jsonl(tmp_path_factory.mktemp("d") / "texts.jsonl", addition_texts(30))


@pytest.mark.slow  # a training process killed and resumed
def test_killed_and_resumed_run_equals_the_uninterrupted_run(hf_dir, data, tmp_path):
    ckpt = tmp_path / "ckpt"
    first = _run_worker(tmp_path / "first.log", "train-then-hang", hf_dir, data, ckpt, FIRST, tmp_path)
    try:
        line = first.stdout.readline()
        assert line.strip() == "SAVED", (tmp_path / "first.log").read_text()[-3000:]
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=30)
    second = _run_worker(tmp_path / "second.log", "resume", hf_dir, data, ckpt, MORE, tmp_path)

    # meanwhile, the uninterrupted run in this process
    trainer, batches = _trainer_and_batches(hf_dir, data)
    for _ in range(FIRST + MORE):
        trainer.pretrain_step(next(batches))
    expected = host_leaves(trainer.state.params)
    expected_per_layer = host_leaves(nnx.state(trainer.model, nnx.Param))  # the export's tree (tunix's)

    out, _ = second.communicate(timeout=600)
    assert second.returncode == 0, (tmp_path / "second.log").read_text()[-3000:]
    report = json.loads(out.strip().splitlines()[-1])
    assert report["step"] == report["state_step"] == report["weight_version"] == FIRST
    assert report["extra"] == EXTRA
    assert DataPosition(**report["position"]) == batches.position
    resumed = np.load(tmp_path / "params.npz")
    resumed = [resumed[f"arr_{i}"] for i in range(len(resumed.files))]
    assert len(resumed) == len(expected)
    for a, b in zip(resumed, expected, strict=True):
        np.testing.assert_array_equal(a, b)  # exactly, not approximately
    # the exported HF dir holds the same weights
    exported = host_leaves(nnx.state(load_model(tmp_path / "hf").model, nnx.Param))
    for a, b in zip(exported, expected_per_layer, strict=True):
        np.testing.assert_array_equal(a, b)


def test_retention_interval_and_empty_directory(hf_dir, data, tmp_path):
    trainer, batches = _trainer_and_batches(hf_dir, data)
    checkpointer = Checkpointer(tmp_path / "ckpt", max_to_keep=2, save_every=2)
    assert checkpointer.restore(trainer.state) is None
    saved = [checkpointer.save(step, trainer.state, {"step": step}, weight_version=10 + step)
             for step in range(1, 6)]
    checkpointer.wait()
    assert saved == [False, True, False, True, False]
    assert checkpointer.all_steps() == [2, 4] and checkpointer.latest_step() == 4
    assert checkpointer.save(5, trainer.state, {"step": 5}, force=True)
    checkpointer.wait()
    assert checkpointer.all_steps() == [4, 5]
    restored = checkpointer.restore(trainer.state, step=4)
    assert restored.extra == {"step": 4} and restored.weight_version == 14 and restored.data_position is None
    # restored arrays keep the template's shardings (the mesh of this run)
    for got, want in zip(jax.tree.leaves(restored.state), jax.tree.leaves(trainer.state), strict=True):
        assert got.sharding == want.sharding
    checkpointer.close()


if __name__ == "__main__":
    _worker(sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]), Path(sys.argv[4]), int(sys.argv[5]),
            Path(sys.argv[6]))

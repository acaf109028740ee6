"""A learner spanning processes: 2 JAX processes × 4 simulated CPU devices on loopback (gloo) against
one process with 8 devices, on the same fsdp=4 × tp=2 mesh.

- RL (tests/multihost_worker.py: the real gRPC service on process 0) with a real vLLM rollout actor on
  Ray sampling and scoring the groups: exactly-once accounting, and a single process fed the same
  groups step by step (replayed over gRPC) ends every step within 1e-6 of the two; the initial
  version is bit-identical and the last one bit-identical to a single-process export of the params
  the two processes trained.
- pretrain and sft through their entrypoints (distributed.* keys): hf_final within 1e-6.
- a learner process killed mid-run: the other stops within the heartbeat timeout with the reason,
  and the relaunched pair resumes from the checkpoint with no group lost or trained twice.

Each 2-process run costs 1-3 minutes on a 2-core machine (two JAX processes start, compile, gloo).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import jax
import multihost_worker
import numpy as np
import pytest
from reliability_helpers import PROMPTS_PER_STEP, check_run, final_history, free_port, read_steps
from safetensors.numpy import load_file

from launch.json_files import write_jsonl
from launch.stages import main_for
from learner.weights.publisher import pack_weights

ROOT = Path(__file__).resolve().parents[1]
TOL = 1e-6
HEARTBEAT_S = 10  # multihost_worker's heartbeat timeout
pytestmark = pytest.mark.slow


def start(argv_of, n: int) -> list[subprocess.Popen]:
    """Start `n` processes (argv_of(i)), 8 // n simulated devices each."""
    env = {**os.environ, "XLA_FLAGS": f"--xla_force_host_platform_device_count={8 // n}", "JAX_PLATFORMS": "cpu"}
    return [subprocess.Popen([sys.executable, *argv_of(i)], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True) for i in range(n)]


def finish(procs: list[subprocess.Popen], timeout: float = 600) -> list[tuple[int, str]]:
    """(exit code, output) of each of `procs`; any still running after `timeout` is killed."""
    deadline = time.monotonic() + timeout
    out = []
    try:
        for proc in procs:
            text, _ = proc.communicate(timeout=max(deadline - time.monotonic(), 1))
            out.append((proc.returncode, text))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return out


def spawn(argv_of, n: int, *, timeout: float = 600) -> list[tuple[int, str]]:
    """Run `n` processes (argv_of(i)), 8 // n simulated devices each; (exit code, output) of each."""
    return finish(start(argv_of, n), timeout)


def rl_pair(run_dir: Path, steps: int, die: tuple[int, int] | None = None) -> list[tuple[int, str]]:
    """The 2-process RL run of tests/multihost_worker.py; die=(process, step) kills one after a step."""
    port = free_port()
    worker = str(ROOT / "tests" / "multihost_worker.py")
    return spawn(lambda i: [worker, str(run_dir), str(steps), "2", str(i), str(port),
                            *(["--die-at", str(die[1])] if die and die[0] == i else [])], 2)


def params_at(run_dir: Path, step: int) -> dict[str, np.ndarray]:
    return dict(np.load(run_dir / "params" / f"step_{step}.npz"))


def export_checksum(model_dir: Path, params: dict[str, np.ndarray], version: int) -> str:
    """sha256 of version `version` exported by one process (8 devices) from the given params."""
    from learner.algo.optim import OptimizerConfig
    from learner.algo.train_step import Trainer
    from learner.mesh import make_learner_mesh
    from learner.schema import MeshConfig
    from models.jax_model import load_model

    mesh = make_learner_mesh(MeshConfig(fsdp=4, tp=2))
    trainer = Trainer(load_model(model_dir, mesh=mesh), mesh, OptimizerConfig())
    leaves, treedef = jax.tree_util.tree_flatten_with_path(trainer.state.params)
    placed = [jax.device_put(params["/".join(map(str, path))], leaf.sharding) for path, leaf in leaves]
    trainer.state = trainer.state._replace(params=jax.tree_util.tree_unflatten(treedef, placed))
    return pack_weights(version, trainer.hf_tensors()).checksum


def test_rl_on_two_processes_with_a_real_vllm_actor_equals_one_process_fed_the_same_groups(tmp_path, ray_session):
    """A real vLLM rollout actor (Ray, reward workers, the weight path) samples for the 2-process learner;
    one process fed the groups it trained on, step by step, ends each step within 1e-6 of it."""
    from reliability_helpers import start_fleet, stop_fleet, tiny_run

    steps = 3
    one, two = tmp_path / "one", tmp_path / "two"
    # mixed rewards from a random tiny model: does the completion hold a digit?
    reward = 'rewards.functions=[{ref: format_regex, kwargs: {pattern: "[0-9]"}}]'
    run = tiny_run(two, steps=steps, checkpoint_every=2, overrides=[*multihost_worker.MODEL, reward])
    serve, port = free_port(), free_port()
    worker = str(ROOT / "tests" / "multihost_worker.py")
    pair = start(lambda i: [worker, str(two), str(steps), "2", str(i), str(port), "--serve-port", str(serve)], 2)
    pool, fleet = start_fleet(run, f"127.0.0.1:{serve}", num_actors=1)
    try:
        results = finish(pair)
    finally:
        (stats,) = stop_fleet(pool, fleet).values()
    assert [code for code, _ in results] == [0, 0], results[0][1][-3000:] + results[1][1][-3000:]
    two_steps = read_steps(two / "steps.jsonl")
    assert {g[1] for s in two_steps for g in s["groups"]} == {"actor-0"}  # sampled by the vLLM actor
    summary = json.loads((two / "summary.json").read_text())
    check_run(summary["accounting"], final_history(two_steps), steps)
    assert stats.versions_applied and stats.groups_sent >= steps * PROMPTS_PER_STEP

    multihost_worker.main(one, steps, 1, 0, 0, replay_from=two / "batches.jsonl")  # 8 devices here
    one_steps = read_steps(one / "steps.jsonl")
    assert [[g[0] for g in s["groups"]] for s in one_steps] == [[g[0] for g in s["groups"]] for s in two_steps]
    assert all(s["broadcast_s"] is not None for s in two_steps)  # process 0's batch went to process 1
    rewards = [c["reward"] for line in (two / "batches.jsonl").read_text().splitlines()
               for g in json.loads(line)["groups"] for c in g["completions"]]
    assert 0 < sum(r == 1.0 for r in rewards) < len(rewards)  # a learning signal, so the params move
    for step in range(1, steps + 1):
        a, b = params_at(one, step), params_at(two, step)
        diff = max(float(np.abs(a[k] - b[k]).max()) for k in a)
        assert diff < TOL, (step, diff)
    one_weights, two_weights = (json.loads((d / "weights.json").read_text()) for d in (one, two))
    assert sorted(map(int, two_weights)) == list(range(steps + 1))
    assert two_weights["0"] == one_weights["0"]  # the initial weights: gathered over processes, same bytes
    # version k (trained by 2 processes, gathered, published) == one process's export of those params
    assert two_weights[str(steps)] == export_checksum(two / "init_model", params_at(two, steps), steps)
    print(f"\nreal vLLM actor for 2 learner processes: {sum(len(s['groups']) for s in two_steps)} groups in "
          f"{steps} steps, versions applied {stats.versions_applied}; 1 process on the same groups within {TOL}")


@pytest.mark.parametrize("mode", ["pretrain", "sft"])
def test_supervised_on_two_processes_equals_one_process(tmp_path, mode):
    rng = np.random.default_rng(0)
    pairs = rng.integers(10, 100, (64, 2))
    rows = ([{"text": f"{a}+{b}={a + b}"} for a, b in pairs] if mode == "pretrain" else
            [{"messages": [{"role": "user", "content": f"{a}+{b}"},
                           {"role": "assistant", "content": str(a + b)}]} for a, b in pairs])
    data = write_jsonl(tmp_path / "data.jsonl", rows)
    common = [f"data.train={data}", "data.seq_len=32", "train.steps=3", "train.batch_size=8",
              "train.checkpoint_every=2", "optim.learning_rate=1e-5", *multihost_worker.MODEL[:8]]

    assert main_for(mode, [f"run_dir={tmp_path / 'one'}", *common]) == 0  # 8 devices in this process
    port = free_port()
    results = spawn(lambda i: [f"launch/{mode}.py", f"run_dir={tmp_path / 'two'}", *common,
                               f"distributed.coordinator_address=127.0.0.1:{port}",
                               "distributed.num_processes=2", f"distributed.process_id={i}"], 2)
    assert [code for code, _ in results] == [0, 0], results[0][1][-3000:] + results[1][1][-3000:]
    one, two = (load_file(tmp_path / d / "hf_final" / "model.safetensors") for d in ("one", "two"))
    start = load_file(tmp_path / "one" / "init_model" / "model.safetensors")
    assert one.keys() == two.keys()
    assert max(float(np.abs(one[k] - two[k]).max()) for k in one) < TOL
    assert max(float(np.abs(one[k] - start[k]).max()) for k in one) > 2 * TOL  # it trained
    assert sorted(p.name for p in (tmp_path / "two" / "checkpoints").iterdir()) == ["2", "3"]


def test_a_killed_learner_process_stops_the_other_and_the_relaunch_resumes(tmp_path):
    steps, die_at = 4, 3  # a checkpoint at step 2; process 1 is SIGKILLed after step 3
    started = time.monotonic()
    results = rl_pair(tmp_path, steps, die=(1, die_at))
    (code0, out0), (code1, _) = results
    assert code1 == -9
    assert code0 != 0 and "JAX distributed service detected fatal errors" in out0, out0[-3000:]
    assert "heartbeat" in out0, out0[-3000:]  # the reason: process 1 stopped sending heartbeats
    killed_at = float((tmp_path / "killed_at").read_text())
    assert time.time() - killed_at < HEARTBEAT_S + 30, time.time() - killed_at  # stopped, not hung
    assert time.monotonic() - started < 600

    before = read_steps(tmp_path / "steps.jsonl")  # step 3 is logged unless process 0 stopped first
    assert [s["step"] for s in before] in ([1, 2], [1, 2, 3])
    results = rl_pair(tmp_path, steps)
    assert [code for code, _ in results] == [0, 0], results[0][1][-3000:] + results[1][1][-3000:]
    entries = read_steps(tmp_path / "steps.jsonl")
    assert [s["step"] for s in entries[len(before):]] == [3, 4]  # resumed after the step-2 checkpoint
    summary = json.loads((tmp_path / "summary.json").read_text())
    check_run(summary["accounting"], final_history(entries), steps)  # none lost, none trained twice
    assert summary["step"] == steps and summary["version"] > 1_000_000  # a restarted learner's versions

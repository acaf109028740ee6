"""Multi-host learner overheads: per RL step, the batch broadcast (process 0 → all) and the version
export (all-gather of every tensor, one at a time) against the step itself, 1 vs 2 processes.

    python tests/benchmarks/bench_multihost.py [--steps S] [--scales 1,10]

Runs the demo's RL learner shape (launch/configs/demo_rl.yaml: the 0.6M-param tiny Qwen2, 32 prompts ×
8 completions, 24 + 8 tokens) and a 10× batch, first as one process with 8 simulated CPU devices,
then as 2 JAX processes × 4 devices (gloo on loopback), on the same fsdp × tp mesh. Each process
times, per step: `exchange` of an assembled RLBatch (learner.multihost; 0 for one process), the jitted
rl step, and draining `Trainer.hf_tensors()` (+ pack_weights on process 0, as a publish does).
Printed: median seconds and each as a fraction of the step, 2 processes vs 1 side by side, the bytes
each process receives for one version (all-gather: (N-1)/N of the model) and one batch, and the time
of the alternative fan-out (`fanout_rows`: make_array_from_process_local_data + one reshard).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DEMO = dict(family="qwen2", num_layers=3, hidden_size=128, intermediate_size=384, num_heads=4, num_kv_heads=2,
            head_dim=32)
PROMPTS, GROUP, LENGTH = 32, 8, 32


def worker(model_dir: str, scale: int, steps: int, num_processes: int, process_id: int, port: int) -> None:
    """One learner process: time broadcast, step and export for `steps` steps; process 0 prints JSON."""
    sys.path.insert(0, str(ROOT))
    import jax
    import numpy as np

    from learner.algo.rl_batch import RLBatch
    from learner.algo.train_step import Trainer
    from learner.mesh import init_distributed, is_leader, make_learner_mesh
    from learner.multihost import StepMessage, exchange
    from learner.rl_loop import BATCH_LAYOUT
    from learner.schema import DistributedConfig, MeshConfig, OptimizerConfig
    from learner.weights.publisher import pack_weights
    from models.jax_model import load_model

    if num_processes > 1:
        init_distributed(DistributedConfig(coordinator_address=f"127.0.0.1:{port}", num_processes=num_processes,
                                           process_id=process_id))
    mesh = make_learner_mesh(MeshConfig(fsdp=4, tp=2))
    trainer = Trainer(load_model(Path(model_dir), mesh=mesh), mesh, OptimizerConfig(learning_rate=1e-5),
                      skip_no_signal=False)
    rows = PROMPTS * GROUP * scale
    rng = np.random.default_rng(0)
    attention = (np.arange(LENGTH)[None] < rng.integers(26, LENGTH + 1, rows)[:, None]).astype(np.int32)
    completion = (attention * (np.arange(LENGTH)[None] >= 24)).astype(np.float32)
    positions = (np.arange(LENGTH, dtype=np.int32)[None] * attention).astype(np.int32)  # one sequence a row
    batch = RLBatch(rng.integers(5, 40, (rows, LENGTH)).astype(np.int32), attention, attention.copy(), positions,
                    completion, np.where(completion > 0, -1.5, 0).astype(np.float32),
                    (rng.normal(size=(rows, 1)) * completion).astype(np.float32))  # one advantage per completion
    times: dict[str, list[float]] = {"broadcast_s": [], "step_s": [], "export_s": [], "fanout_s": []}
    fanout = fanout_rows(mesh) if num_processes > 1 else None
    for step in range(steps + 1):  # step 0 compiles
        started = time.perf_counter()
        if num_processes > 1:
            message = exchange(StepMessage("batch", batch._asdict()) if is_leader() else None, BATCH_LAYOUT)
            received = RLBatch(**message.arrays)
        else:
            received = batch
        sent = time.perf_counter()
        trainer.rl_step(received)
        stepped = time.perf_counter()
        tensors = list(trainer.hf_tensors())
        if is_leader():
            pack_weights(step + 1, tensors)
        exported = time.perf_counter()
        fanned = time.perf_counter()
        if fanout is not None:
            jax.block_until_ready(fanout(batch._asdict() if is_leader() else
                                         {k: np.zeros_like(v) for k, v in batch._asdict().items()}))
        if step:
            for key, value in zip(times, (sent - started, stepped - sent, exported - stepped,
                                          time.perf_counter() - fanned), strict=True):
                times[key].append(value)
    if is_leader():
        model_bytes = sum(t.nbytes for _, t in tensors)
        print("RESULT " + json.dumps({
            **{k: statistics.median(v) for k, v in times.items()},
            "batch_bytes": sum(a.nbytes for a in batch), "model_bytes": model_bytes,
            "export_bytes_in_per_process": model_bytes * (num_processes - 1) // num_processes}), flush=True)


def fanout_rows(mesh):
    """The alternative to broadcast_one_to_all: process 0's rows enter as a [processes, B, ...] array
    (`make_array_from_process_local_data`, the other processes' slices zero) and one jitted reshard
    sends each device only its own rows of process 0's slice (rather than the whole batch to every
    device, then a local slice)."""
    import jax
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    from learner.mesh import row_sharding

    by_process = Mesh(np.array(jax.devices()).reshape(jax.process_count(), -1), ("processes", "local"))
    stacked = NamedSharding(by_process, PartitionSpec("processes"))
    take = jax.jit(lambda tree: jax.tree.map(lambda x: x[0], tree), out_shardings=row_sharding(mesh))

    def fan(arrays):
        return take({k: jax.make_array_from_process_local_data(stacked, v[None], (jax.process_count(), *v.shape))
                     for k, v in arrays.items()})

    return fan


def run(model_dir: Path, scale: int, steps: int, n: int) -> dict:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "XLA_FLAGS": f"--xla_force_host_platform_device_count={8 // n}", "JAX_PLATFORMS": "cpu"}
    procs = [subprocess.Popen([sys.executable, __file__, "--worker", str(model_dir), str(scale), str(steps), str(n),
                               str(i), str(port)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True) for i in range(n)]
    outs = [p.communicate()[0] for p in procs]
    for p, out in zip(procs, outs, strict=True):
        if p.returncode:
            raise RuntimeError(out[-3000:])
    line = next(line for line in outs[0].splitlines() if line.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


def main() -> None:
    if sys.argv[1:2] == ["--worker"]:
        worker(sys.argv[2], *(int(a) for a in sys.argv[3:]))
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=5, help="timed steps (after one compiling step)")
    parser.add_argument("--scales", default="1,10", help="batch sizes as multiples of the demo's 256 rows")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    from models.tiny import make_tiny_model

    with tempfile.TemporaryDirectory() as tmp:
        model_dir = make_tiny_model(Path(tmp) / "model", seed=0, **DEMO)
        print(f"{'batch':>12} {'procs':>5} {'step s':>8} {'bcast s':>8} {'bcast/step':>10} {'export s':>8} "
              f"{'export/step':>11} {'batch MB':>8} {'export MB in/proc':>17} {'fan-out s':>9}")
        for scale in (int(s) for s in args.scales.split(",")):
            results = {n: run(model_dir, scale, args.steps, n) for n in (1, 2)}
            for n, r in results.items():
                print(f"{PROMPTS * GROUP * scale:>7} rows {n:>5} {r['step_s']:8.3f} {r['broadcast_s']:8.3f} "
                      f"{r['broadcast_s'] / r['step_s']:10.2f} {r['export_s']:8.3f} "
                      f"{r['export_s'] / r['step_s']:11.2f} "
                      f"{r['batch_bytes'] / 1e6:8.2f} {r['export_bytes_in_per_process'] / 1e6:17.2f} "
                      f"{r['fanout_s']:9.3f}")
            one, two = results[1], results[2]
            print(f"{'':>12} 2 vs 1: step {two['step_s'] / one['step_s']:.2f}x, export "
                  f"{two['export_s'] / one['export_s']:.2f}x")


if __name__ == "__main__":
    main()

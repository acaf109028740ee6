"""One learner process of the multi-host RL tests: a tiny RL run whose process 0 is fed recorded
groups over real gRPC by an actor thread (a real LearnerClient on loopback).

    python tests/multihost_worker.py RUN_DIR STEPS NUM_PROCESSES PROCESS_ID PORT [DIE_AT_STEP]

NUM_PROCESSES=1 is the single-process reference (give it 8 simulated devices); with more, each
process joins jax.distributed on 127.0.0.1:PORT (give each 8 / NUM_PROCESSES devices). Either way the
mesh is fsdp=4 × tp=2 over 8 devices. The groups are "recorded": every completion's tokens,
logprobs and reward are a function of its group id alone, so two runs that lease the same prompts
train on the same groups. Process 0 writes, under RUN_DIR:
    params/step_K.npz     every parameter after step K (gathered from all processes)
    steps.jsonl           each step's groups: [id, actor, version] (appended as it happens; survives a kill)
    weights.json          {version: sha256} of every version the actor thread fetched over the wire
    summary.json          the final accounting, versions, learner step
With DIE_AT_STEP this process SIGKILLs itself after that step (the others must then stop on their own),
writing the time into RUN_DIR/killed_at first.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
import zlib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for path in (ROOT, ROOT / "tests"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

GROUP_SIZE = 4
MODEL = ["model.tiny.num_layers=2", "model.tiny.hidden_size=128", "model.tiny.intermediate_size=128",
         "model.tiny.num_heads=4", "model.tiny.num_kv_heads=4", "model.tiny.head_dim=32",
         "mesh.fsdp=4", "mesh.tp=2", "optim.learning_rate=1e-5", "rollout.max_staleness=1000",
         "rollout.lease_seconds=600", "rollout.queue_capacity=64"]


def recorded_group(lease, version: int):
    """The group an actor 'sampled' for `lease`: a pure function of its group id (mixed rewards)."""
    import numpy as np

    from tandem_wire import WIRE_VERSION, pb

    seed = zlib.crc32(lease.group_id.encode())
    rng = np.random.default_rng(seed)
    group = pb.ScoredGroup(wire_version=WIRE_VERSION, group_id=lease.group_id, actor_id="recorded",
                           policy_version=version, prompt_token_ids=lease.prompt_ids, metadata=lease.metadata,
                           timings=pb.Timings(sample_seconds=0.1, score_seconds=0.01))
    for i in range(GROUP_SIZE):
        n = int(rng.integers(1, 5))
        group.completions.add(token_ids=rng.integers(5, 15, n).tolist(),
                              logprobs=(-rng.uniform(0.2, 3.0, n)).tolist(), finish_reason=pb.FINISH_REASON_STOP,
                              text="x", reward=float((i + seed) % 2))
    return group


def feed(address: str, stop: threading.Event, checksums: dict[int, str], abort) -> None:
    """Lease prompts, answer each with its recorded group, fetch every new weight version; an error
    aborts the run (`abort(reason)`)."""
    from wire_helpers import CAPABILITIES

    from actors.learner_client import LearnerClient

    client = LearnerClient(address, "recorded")
    client.register({**CAPABILITIES, "group_size": GROUP_SIZE, "max_model_len": 64}, weight_version=0)
    served = None  # version 0 is fetched too
    try:
        while not stop.is_set():
            newest = client.latest_version
            if newest != served:
                staged = client.fetch_weights(newest)
                checksums[staged.version] = staged.checksum
                if client.report_weights(staged.version, applied=True):
                    served = staged.version
            leases = client.lease_prompts(4).prompts
            for lease in leases:
                if not client.is_unacked(lease.group_id):
                    try:
                        client.send_group(recorded_group(lease, served), timeout=5)
                    except TimeoutError:  # the learner is busy: the group stays queued in the client
                        pass
            if not leases:
                stop.wait(0.05)
    except Exception as error:
        abort(f"recorded actor failed: {error!r}")
        raise
    finally:
        client.close()


def main(run_dir: Path, steps: int, num_processes: int, process_id: int, port: int, die_at: int | None) -> None:
    import jax
    import numpy as np
    from jax.experimental import multihost_utils
    from reliability_helpers import build_learner, tiny_run

    from learner.mesh import init_distributed, is_leader
    from learner.schema import DistributedConfig

    if num_processes > 1:
        init_distributed(DistributedConfig(coordinator_address=f"127.0.0.1:{port}", num_processes=num_processes,
                                           process_id=process_id, heartbeat_timeout_s=10,
                                           initialization_timeout_s=120))

    def prepared():
        return tiny_run(run_dir, steps=steps, checkpoint_every=2, overrides=MODEL)

    run = prepared() if is_leader() else None  # process 0 writes the model and data first
    if num_processes > 1:
        multihost_utils.sync_global_devices("prepared")
    run = run or prepared()
    loop = build_learner(run)
    (run_dir / "params").mkdir(exist_ok=True)

    def on_step(step: int, metrics: dict) -> None:
        params = loop.trainer.state.params
        host = multihost_utils.process_allgather(params, tiled=True) if num_processes > 1 else jax.device_get(params)
        if is_leader():
            flat = {"/".join(map(str, k)): np.asarray(v) for k, v in jax.tree_util.tree_flatten_with_path(host)[0]}
            np.savez(run_dir / "params" / f"step_{step}.npz", **flat)
            with (run_dir / "steps.jsonl").open("a") as f:
                groups = [[g.group_id, g.actor_id, g.policy_version] for g in loop.last_groups]
                f.write(json.dumps({"step": step, "groups": groups,
                                    "broadcast_s": metrics.get("batch_broadcast_s")}) + "\n")
            deadline = time.monotonic() + 120  # the actor thread fetches every version over the wire
            while loop.version not in checksums and time.monotonic() < deadline:
                time.sleep(0.05)
        if step == die_at:
            (run_dir / "killed_at").write_text(str(time.time()))
            os.kill(os.getpid(), signal.SIGKILL)

    stop, checksums = threading.Event(), {}
    address = loop.start("127.0.0.1:0")
    actor = None
    if is_leader():
        actor = threading.Thread(target=feed, args=(address, stop, checksums, loop.abort), daemon=True)
        actor.start()
    try:
        accounting = loop.run(on_step=on_step)
        loop.trainer.export_hf(run_dir / "hf_final", tokenizer_dir=run.model_dir)
    finally:
        stop.set()
        if actor is not None:
            actor.join(timeout=30)
            loop.service.stop(grace=0)
        loop.checkpointer.close()
    if is_leader():
        (run_dir / "weights.json").write_text(json.dumps(checksums))
        (run_dir / "summary.json").write_text(json.dumps(
            {"accounting": accounting, "version": loop.version, "step": loop.step}))


if __name__ == "__main__":
    args = sys.argv[1:]
    main(Path(args[0]), int(args[1]), int(args[2]), int(args[3]), int(args[4]),
         int(args[5]) if len(args) > 5 else None)

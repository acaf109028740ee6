"""One learner process of the multi-host RL tests: a tiny RL run whose process 0 is fed groups over real
gRPC: recorded ones by an actor thread (a real LearnerClient on loopback), replayed ones, or those of
real vLLM rollout actors the test starts.

    python tests/multihost_worker.py RUN_DIR STEPS NUM_PROCESSES PROCESS_ID PORT [--die-at K]
                                     [--serve-port P | --replay RUN_DIR/batches.jsonl]

NUM_PROCESSES=1 is the single-process reference (give it 8 simulated devices); with more, each
process joins jax.distributed on 127.0.0.1:PORT (give each 8 / NUM_PROCESSES devices). Either way the
mesh is fsdp=4 × tp=2 over 8 devices. The groups:
- by default "recorded": every completion's tokens, logprobs and reward are a function of its group id
  alone, so two runs that lease the same prompts train on the same groups;
- with --serve-port, process 0 serves on that port and feeds nothing: real actors (the test's fleet)
  sample the groups;
- with --replay, an actor thread sends each step the groups another run trained on at that step
  (its batches.jsonl), in the same order, and waits for them to be consumed before the next step's.
Process 0 writes, under RUN_DIR:
    params/step_K.npz     every parameter after step K (gathered from all processes)
    steps.jsonl           each step's groups: [id, actor, version] (appended as it happens; survives a kill)
    batches.jsonl         each step's groups whole (tokens, logprobs, rewards), in batch order
    weights.json          {version: digest} of every version published (fetched over the wire by the
                          actor thread, or read from the service when real actors fetch them)
    summary.json          the final accounting, versions, learner step
With --die-at this process SIGKILLs itself after that step (the others must then stop on their own),
writing the time into RUN_DIR/killed_at first.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import threading
import time
import zlib
from collections.abc import Iterator
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
        group.completions.add(token_ids=rng.integers(5, 15, n).tolist(), token_versions=[version] * n,
                              logprobs=(-rng.uniform(0.2, 3.0, n)).tolist(), finish_reason=pb.FINISH_REASON_STOP,
                              text="x", reward=float((i + seed) % 2))
    return group


@contextlib.contextmanager
def actor_client(address: str, actor_id: str, abort) -> Iterator:
    """A registered LearnerClient for an actor thread; an error in it aborts the run (`abort(reason)`)."""
    from reliability_helpers import ENROLLMENT_KEY
    from wire_helpers import CAPABILITIES

    from actors.learner_client import LearnerClient
    from tandem_wire import enrollment

    # the learner is build_learner's: it admits the ids enrolled under the tests' key, as a fleet's
    client = LearnerClient(address, actor_id, enrollment=enrollment.token(ENROLLMENT_KEY, actor_id))
    client.register({**CAPABILITIES, "group_size": GROUP_SIZE, "max_model_len": 64}, weight_version=0)
    try:
        yield client
    except Exception as error:
        abort(f"{actor_id} actor failed: {error!r}")
        raise
    finally:
        client.close()


def feed(address: str, stop: threading.Event, checksums: dict[int, str], abort) -> None:
    """Lease prompts, answer each with its recorded group, fetch every new weight version."""
    served = None  # version 0 is fetched too
    with actor_client(address, "recorded", abort) as client:
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


def replay(address: str, stop: threading.Event, checksums: dict[int, str], abort, batches: Path) -> None:
    """Send each recorded step's groups (batches.jsonl of another run) for the same prompts, in the same
    order, once all are leased; wait until they are consumed; fetch every new weight version."""
    from tandem_wire import WIRE_VERSION, pb

    recorded = [json.loads(line)["groups"] for line in batches.read_text().splitlines()]
    leases: dict = {}
    with actor_client(address, "replay", abort) as client:
        for groups in recorded:
            fetch_newest(client, checksums)
            while not stop.is_set() and any(g["id"] not in leases for g in groups):
                for lease in client.lease_prompts(8).prompts:
                    leases[lease.group_id] = lease
            for g in groups:
                lease = leases.pop(g["id"])
                group = pb.ScoredGroup(wire_version=WIRE_VERSION, group_id=g["id"], actor_id="replay",
                                       policy_version=g["version"], prompt_token_ids=lease.prompt_ids,
                                       metadata=lease.metadata, timings=pb.Timings(sample_seconds=0.1))
                for c in g["completions"]:
                    group.completions.add(token_ids=c["token_ids"], logprobs=c["logprobs"], text=c["text"],
                                          token_versions=[g["version"]] * len(c["token_ids"]),
                                          finish_reason=getattr(pb, f"FINISH_REASON_{c['finish_reason'].upper()}"),
                                          **({"reward": c["reward"]} if c["reward"] is not None else
                                             {"unscorable_reason": c["unscorable_reason"]}))
                client.send_group(group, timeout=30)
            while not stop.is_set() and any(client.is_unacked(g["id"]) for g in groups):
                fetch_newest(client, checksums)
                time.sleep(0.02)
        while not stop.is_set():  # the last version
            fetch_newest(client, checksums)
            stop.wait(0.05)


def fetch_newest(client, checksums: dict[int, str]) -> None:
    """Fetch the learner's newest version over the wire (and report it applied) unless held already.
    Called while waiting too: the learner's step waits until its version is fetched, and a step's
    CONSUMED acks arrive before that version is published."""
    newest = client.latest_version
    if newest not in checksums:
        staged = client.fetch_weights(newest)
        checksums[staged.version] = staged.checksum
        client.report_weights(staged.version, applied=True)


def batch_record(groups) -> list[dict]:
    """A step's groups whole (learner.service.group_validation.GroupRecord), for batches.jsonl."""
    return [{"id": g.group_id, "version": g.policy_version,
             "completions": [{"token_ids": c.token_ids, "logprobs": c.logprobs, "text": c.text,
                              "finish_reason": c.finish_reason, "reward": c.reward,
                              "unscorable_reason": c.unscorable_reason} for c in g.completions]}
            for g in groups]


def main(run_dir: Path, steps: int, num_processes: int, process_id: int, port: int, die_at: int | None = None,
         serve_port: int = 0, replay_from: Path | None = None) -> None:
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
            with (run_dir / "batches.jsonl").open("a") as f:
                f.write(json.dumps({"step": step, "groups": batch_record(loop.last_groups)}) + "\n")
            if serve_port:
                note_published(loop.service, checksums)
            deadline = time.monotonic() + 120  # the actor thread fetches every version over the wire
            while loop.version not in checksums and time.monotonic() < deadline:
                time.sleep(0.05)
        if step == die_at:
            (run_dir / "killed_at").write_text(str(time.time()))
            os.kill(os.getpid(), signal.SIGKILL)

    stop, checksums = threading.Event(), {}
    address = loop.start(f"127.0.0.1:{serve_port}")
    actor = None
    if is_leader() and serve_port:
        note_published(loop.service, checksums)  # real actors fetch the versions
    elif is_leader():
        feeder, args = (replay, (replay_from,)) if replay_from else (feed, ())
        actor = threading.Thread(target=feeder, args=(address, stop, checksums, loop.abort, *args), daemon=True)
        actor.start()
    try:
        accounting = loop.run(on_step=on_step)
        loop.trainer.export_hf(run_dir / "hf_final", tokenizer_dir=run.model_dir)
    finally:
        stop.set()
        if actor is not None:
            actor.join(timeout=30)
        if is_leader():
            loop.service.stop(grace=0)
        loop.checkpointer.close()
    if is_leader():
        (run_dir / "weights.json").write_text(json.dumps(checksums))
        (run_dir / "summary.json").write_text(json.dumps(
            {"accounting": accounting, "version": loop.version, "step": loop.step}))


def note_published(service, checksums: dict[int, str]) -> None:
    """The digest of the service's newest version (what real actors fetch)."""
    weights = service._desk.held()
    checksums[weights.version] = weights.checksum


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    for name in ("run_dir", "steps", "num_processes", "process_id", "port"):
        parser.add_argument(name, type=Path if name == "run_dir" else int)
    parser.add_argument("--die-at", type=int)
    parser.add_argument("--serve-port", type=int, default=0)
    parser.add_argument("--replay", type=Path)
    a = parser.parse_args()
    main(a.run_dir, a.steps, a.num_processes, a.process_id, a.port, a.die_at, a.serve_port, a.replay)

"""Shared by the fault-injection tests: a tiny RL run (real learner, vLLM actors, reward pool), the
faults (SIGKILL / SIGSTOP an actor, hang its engine, corrupt a weight push) and the run checks.

Run as a script it is the learner-kill tests' driver: a learner process (trainer + gRPC service +
RL loop, no Ray) on a fixed port that logs every step and writes a summary; SIGKILL it and start it
again with the same arguments, and it resumes from its last checkpoint.

    python tests/reliability_helpers.py RUN_DIR PORT STEPS CHECKPOINT_EVERY [HOLD_AT_STEP]

With HOLD_AT_STEP the driver stops after that step, once every actor serves the step's weight version,
writes RUN_DIR/held and waits to be killed (a deterministic point to kill the learner at).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import random
import signal
import socket
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from actors.stats import ActorStats, NoAnswer

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

PROMPTS_PER_STEP = 4
GROUP_SIZE = 4
LEASE_SECONDS = 3.0
ACTOR_TIMEOUT_S = 3.0
# Short liveness settings so a test sees a silent actor within seconds (production: 5 s / 30 s).
# A tiny generate takes well under a second, but this 2-core machine is shared: allow for load.
GENERATE_TIMEOUT_S = 30.0
SHORT_LIVENESS = {"heartbeat_interval_s": 0.5, "actor_timeout_s": ACTOR_TIMEOUT_S}  # rollout.* keys
# The runs' enrollment key (tandem_wire/enrollment.py), held by each learner process and each fleet: a
# learner killed and started again keeps it, as a restarted driver gets it from the fleet it re-attaches to.
ENROLLMENT_KEY = b"tandem reliability tests' key..."
TINY_MODEL = ("model.tiny.num_layers=2", "model.tiny.hidden_size=64", "model.tiny.intermediate_size=128",
              "model.tiny.num_heads=2", "model.tiny.num_kv_heads=1", "model.tiny.head_dim=32")


def write_rl_data(path: Path, n: int = 96, seed: int = 0) -> Path:
    """`n` two-digit additions as rl rows {prompt, answer}."""
    rng = random.Random(seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        for _ in range(n):
            a, b = rng.randrange(10, 100), rng.randrange(10, 100)
            f.write(json.dumps({"prompt": f"{a}+{b}", "answer": str(a + b)}) + "\n")
    return path


def tiny_overrides(run_dir: Path, *, steps: int, checkpoint_every: int = 1, port: int = 0,
                   overrides: list[str] = ()) -> list[str]:
    """tiny_run's config as key=value pairs (for `launch/rl.py` too); writes its data file."""
    data = run_dir / "rl.jsonl"
    if not data.exists():
        write_rl_data(data)
    return [f"run_dir={run_dir}", f"data.train={data}", "mesh.fsdp=1", *TINY_MODEL,
            f"train.steps={steps}", f"train.prompts_per_step={PROMPTS_PER_STEP}",
            f"train.checkpoint_every={checkpoint_every}", "train.keep_checkpoints=2", "train.eval_every=0",
            "optim.warmup_steps=0", f"rollout.group_size={GROUP_SIZE}", "rollout.max_tokens=4",
            "rollout.max_prompt_tokens=16", "rollout.max_model_len=32", "rollout.kv_cache_gib=0.125",
            "train.compile_ahead=first",  # the tiny step compiles in seconds; 2 cores are for the actors
            "rollout.prompts_per_batch=4", "rollout.num_cpus=0", "rollout.queue_capacity=8",
            f"rollout.lease_seconds={LEASE_SECONDS}", "rollout.max_staleness=1", f"server.port={port}",
            *overrides]


def tiny_run(run_dir: Path, **options):
    """A prepared launch Run: tiny model, few steps, P=4 prompts × G=4 completions × 4 tokens;
    `options` are tiny_overrides' (steps, checkpoint_every, port, further config `overrides`)."""
    from launch.config import load_config
    from launch.run import prepare

    return prepare(load_config(None, tiny_overrides(run_dir, **options)), "rl")


def build_learner(run):
    """The run's RLLoop (trainer, service, checkpointer) with the short liveness settings."""
    from transformers import AutoTokenizer

    from launch.rl_mode import build_rl_learner

    config = run.config.model_copy(update={"rollout": run.config.rollout.model_copy(update=SHORT_LIVENESS)})
    return build_rl_learner(dataclasses.replace(run, config=config), AutoTokenizer.from_pretrained(run.model_dir),
                            enrollment_key=ENROLLMENT_KEY)


def start_fleet(run, address: str, num_actors: int):
    """The reward pool and the named fleet of `num_actors` RolloutActors serving `address`."""
    from actors.fleet import start_named_fleet
    from rewards.pool import RewardPool

    pool = RewardPool(run.config.rewards.spec(), num_workers=1)
    fleet = start_named_fleet(run.config.actor_config(run.model_dir), address,
                              pool.handles(), initial_actors=num_actors, enrollment_key=ENROLLMENT_KEY)
    return pool, fleet


def stop_fleet(pool, fleet) -> dict[str, ActorStats | NoAnswer]:
    """Shut the fleet and pool down; returns the last actor stats."""
    import ray

    try:
        stats = ray.get(fleet.stats.remote(5.0), timeout=60)
        ray.get(fleet.shutdown.remote(), timeout=120)
    finally:
        ray.kill(fleet)
        pool.shutdown()
    return stats


@dataclasses.dataclass
class LiveFleet:
    """What `learner_with_fleet` yields: the run's started learner and its fleet; once the block has ended,
    the actors' last stats."""

    loop: object  # learner.rl_loop.RLLoop
    fleet: object  # the named ActorFleet's handle
    stats: dict[str, ActorStats | NoAnswer] = dataclasses.field(default_factory=dict)


@contextlib.contextmanager
def learner_with_fleet(run, num_actors: int) -> Iterator[LiveFleet]:
    """The run's learner, started, with a fleet of `num_actors` actors serving it; on leaving the block the
    fleet (its last stats kept), the service and the checkpointer are stopped."""
    loop = build_learner(run)
    address = loop.start()
    pool, fleet = start_fleet(run, address, num_actors)
    live = LiveFleet(loop, fleet)
    try:
        yield live
    finally:
        live.stats = stop_fleet(pool, fleet)
        loop.service.stop()
        loop.checkpointer.close()


@dataclasses.dataclass
class FleetRun:
    """What `run_with_fleet` returns: the loop, its final accounting, each step's metrics and StepLog entry,
    and the actors' last stats."""

    loop: object  # learner.rl_loop.RLLoop
    accounting: dict
    metrics: dict[int, dict[str, float]]
    entries: list[dict]
    stats: dict


def run_with_fleet(run, num_actors: int, ready=None, settle=None) -> FleetRun:
    """Train the run to its end with its learner and a fleet of `num_actors` actors (after `ready(loop)`
    returns, when given), then (after `settle(loop)` returns, when given) stop the fleet, the service and
    the checkpointer."""
    metrics: dict[int, dict[str, float]] = {}
    with learner_with_fleet(run, num_actors) as live:
        loop = live.loop
        log = StepLog(loop)

        def on_step(step: int, values: dict[str, float]) -> None:
            metrics[step] = dict(values)
            log(step, values)

        if ready is not None:
            ready(loop)
        accounting = loop.run(on_step=on_step)
        if settle is not None:
            settle(loop)
    return FleetRun(loop, accounting, metrics, log.entries, live.stats)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------------- faults


def actor_handle(fleet, actor_id: str):
    import ray

    return ray.get(fleet.actors.remote())[actor_id]


def actor_pid(fleet, actor_id: str) -> int:
    """The OS process of a rollout actor (run inside it through Ray's __ray_call__)."""
    import ray

    return ray.get(actor_handle(fleet, actor_id).__ray_call__.remote(lambda actor: os.getpid()), timeout=30)


def kill_actor(fleet, actor_id: str) -> None:
    """SIGKILL the actor's process: Ray reports it dead."""
    os.kill(actor_pid(fleet, actor_id), signal.SIGKILL)


def freeze_actor(fleet, actor_id: str) -> None:
    """SIGSTOP the actor's process: alive for Ray, silent for the learner (no heartbeats)."""
    os.kill(actor_pid(fleet, actor_id), signal.SIGSTOP)


def hang_engine(fleet, actor_id: str) -> None:
    """Make the actor's next engine call (a streaming step, or a whole generate in sync mode) block
    forever: heartbeats go on, samples stop."""
    import ray

    def hang(actor) -> None:
        forever = threading.Event()
        actor.engine.poll = actor.engine.generate = lambda *args, **kwargs: forever.wait()

    ray.get(actor_handle(fleet, actor_id).__ray_call__.remote(hang), timeout=30)


# ---------------------------------------------------------------------- what a run did


class StepLog:
    """An RLLoop on_step hook recording each step's groups (id, actor, version); optionally appended
    to a jsonl file that survives the process being killed."""

    def __init__(self, loop, path: Path | None = None, hooks: dict | None = None):
        self.loop, self.path, self.hooks = loop, path, dict(hooks or {})
        self.entries: list[dict] = []

    def __call__(self, step: int, metrics: dict[str, float]) -> None:
        entry = {"step": step, "version": self.loop.version, "time": time.time(),
                 "groups": [[g.group_id, g.actor_id, g.policy_version] for g in self.loop.last_groups]}
        self.entries.append(entry)
        if self.path is not None:
            with self.path.open("a") as f:
                f.write(json.dumps(entry) + "\n")
                f.flush()
                os.fsync(f.fileno())
        if step in self.hooks:
            self.hooks.pop(step)()


def read_steps(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def final_history(entries: list[dict]) -> dict[int, dict]:
    """Each step as the surviving history has it: a step redone after a restart replaces the lost one."""
    history: dict[int, dict] = {}
    for entry in entries:
        history[entry["step"]] = entry
    return dict(sorted(history.items()))


def check_run(accounting: dict, history: dict[int, dict], steps: int) -> list[str]:
    """Every step trained on P groups, no group id twice in the history, the counters balance;
    returns the consumed ids."""
    from learner.service.accounting import balance_violations

    assert balance_violations(accounting) == [], (balance_violations(accounting), accounting)
    assert sorted(history) == list(range(1, steps + 1)), sorted(history)
    ids = [g[0] for entry in history.values() for g in entry["groups"]]
    assert len(ids) == steps * PROMPTS_PER_STEP
    assert len(set(ids)) == len(ids), "a group was consumed twice"
    assert accounting["groups_consumed"] == steps * PROMPTS_PER_STEP, accounting
    return ids


# ---------------------------------------------------------------------- the learner-kill driver


def drive_learner(run_dir: Path, port: int, steps: int, checkpoint_every: int, hold_at: int = 0) -> None:
    """Serve and train until `steps` (or hold after step `hold_at`); resumes from run_dir's checkpoints."""
    from learner.service.accounting import balance_violations

    loop = build_learner(tiny_run(run_dir, steps=steps, checkpoint_every=checkpoint_every, port=port))
    loop.start(f"127.0.0.1:{port}")
    starts = run_dir / "starts.jsonl"
    with starts.open("a") as f:
        f.write(json.dumps({"step": loop.step, "version": loop.version, "time": time.time()}) + "\n")
    try:
        def hold() -> None:
            while not ((actors := loop.service.actors_status())
                       and all(a.weight_version == loop.version for a in actors)):
                time.sleep(0.05)
            (run_dir / "held").write_text(json.dumps({"step": loop.step, "version": loop.version}))
            time.sleep(3600)

        accounting = loop.run(on_step=StepLog(loop, run_dir / "steps.jsonl", hooks={hold_at: hold} if hold_at else {}))
    finally:
        loop.service.stop()
        loop.checkpointer.close()
    summary = {"accounting": accounting, "violations": balance_violations(accounting),
               "step": loop.step, "version": loop.version}
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))


if __name__ == "__main__":
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    drive_learner(Path(sys.argv[1]), *(int(arg) for arg in sys.argv[2:]))

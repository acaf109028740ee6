"""The RL loop end to end in one mode, actors pinned to one core and the learner to another.

    .venv/bin/python tests/benchmarks/bench_loop.py --mode async|sync [--steps 20 --warmup 3] [key=value ...]

Runs launch/configs/demo_rl.yaml (or --config) in a fresh local Ray for ``--steps`` RL steps and
measures over the steps after ``--warmup`` (compilation excluded):
  steps_per_min            RL steps per minute
  learner_idle             time the learner waited in next_batch / wall time
  learner_busy             time in its updates and weight publishes / wall time
  actor_busy               time inside engine steps / wall time (mean over actors)
  actor_idle               time an actor was blocked on credits, waiting for prompts (the lease budget
                           also holds it until it serves a new version), or stalled by a weight load,
                           overlaps counted once (ActorStats.idle_seconds) / wall time (mean over actors);
                           actor_idle_parts gives each of the three alone, and they may overlap
  loop_tokens_per_s        tokens the actors generated / wall time (rewards, gRPC, pushes included)
  async_waste_fraction     (tokens aborted by weight loads + tokens of stale groups) / tokens sampled
  weight push              bytes / (fetch + verify + load into vLLM) per update, the raw loopback
                           TCP copy of the same bytes, and the load stall / generation time
Modes: ``async`` as configured (actors sample with v while the learner trains v -> v+1, staleness
<= 1); ``sync`` sets rollout.sync=true and rollout.max_staleness=0 (sample, then train, then push).

Pinning: this process pins itself to the actor cores before Ray starts (Ray's workers, hence the
rollout actors and reward workers, inherit it), then re-pins all its own threads to the learner
cores before JAX starts. With ``--standalone`` the same vLLM engine first generates the same prompts
in the same batches outside the loop (own process, on the actor cores): the loop's baseline.
Prints one JSON line; ``measure_mode`` runs it in a subprocess (what launch/bench.py calls).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from actors.stats import ActorStats

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "benchmarks"))
DEMO_CONFIG = ROOT / "launch" / "configs" / "demo_rl.yaml"
ACTOR_COUNTERS = ("tokens_generated", "tokens_aborted", "generate_seconds", "credit_wait_seconds",
                  "prompt_wait_seconds", "idle_seconds")


def pin_threads(cpus: set[int]) -> None:
    """Pin every thread of this process (sched_setaffinity(0) would pin only the calling one)."""
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), cpus)
        except ProcessLookupError:  # the thread ended meanwhile
            pass


def core_split() -> tuple[set[int], set[int]] | None:
    """(actor cores, learner cores): one half each of the cores this process may use; None on one core."""
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        return None
    half = len(cores) // 2
    return set(cores[:half]), set(cores[half:])


def actor_window(before: ActorStats, after: ActorStats) -> dict[str, float]:
    """Counter differences of one actor between two stats() snapshots."""
    out = {k: getattr(after, k) - getattr(before, k) for k in ACTOR_COUNTERS}
    first = len(before.stall_seconds)
    out["stall_seconds"] = sum(after.stall_seconds[first:])
    out["transfer_seconds"] = list(after.transfer_seconds[first:])
    out["stalls"] = list(after.stall_seconds[first:])
    return out


def run(args: argparse.Namespace) -> dict:
    """The child: one RL run in ``args.mode``; returns the measured numbers."""
    split = core_split()
    if split:
        pin_threads(split[0])
    from launch.config import load_config
    from launch.prompts import chat_prompt_rows
    from launch.run import prepare, setup_process

    setup_process()
    # The model is created from scratch, so every group is all-wrong: the demo's dynamic sampling
    # ('fill') would retire them all, and train.skip_no_signal would skip every update, leaving the
    # learner idle (an earlier version of this benchmark measured exactly that: 3 ms "steps"). Both
    # are off so that every step makes the full update a step with signal makes (an override wins).
    overrides = ["algo.dynamic_sampling=off", "train.skip_no_signal=false", *args.overrides]
    if args.mode == "sync":
        overrides += ["rollout.sync=true", "rollout.max_staleness=0"]
    with tempfile.TemporaryDirectory() as tmp:
        config = load_config(args.config, [*overrides, f"run_dir={tmp}/run", f"data.dir={tmp}/data",
                                           f"train.steps={args.steps}", "train.eval_every=0",
                                           # no evaluations, so no early end at a held-out target
                                           "train.stop_at=null", "train.stop_at_plateau=null",
                                           f"train.checkpoint_every={args.steps + 1}"])
        prepared = prepare(config, "rl")
        pinned = {"actors": sorted(split[0]), "learner": sorted(split[1])} if split else None
        result: dict = {"mode": args.mode, "steps": args.steps, "warmup": args.warmup, "pinned": pinned}
        if args.standalone:
            from bench_rollout import measure_backend
            from transformers import AutoTokenizer

            rollout = config.rollout
            rows = chat_prompt_rows(prepared.train_data, AutoTokenizer.from_pretrained(prepared.model_dir),
                                    config.data, limit=rollout.prompts_per_batch * args.standalone_batches)
            standalone = measure_backend(
                "vllm", prepared.model_dir, prompts=[r.prompt_ids for r in rows],
                group_size=rollout.group_size, max_tokens=rollout.max_tokens, temperature=rollout.temperature,
                repeats=2,
                batch=rollout.prompts_per_batch, max_model_len=rollout.max_model_len, lengths=("natural",),
                cpus=",".join(map(str, sorted(split[0]))) if split else "")
            natural = standalone["natural"]
            result["standalone_tokens_per_s"] = natural["tokens"] / natural["seconds"]
        result.update(run_loop(prepared, args, split))
    return result


def run_loop(prepared, args: argparse.Namespace, split) -> dict:
    import ray
    from bench_weights import tcp_loopback_bytes_per_s

    from actors.fleet import ActorFleet
    from launch import ray_cluster
    from launch.rl_mode import build_rl_learner
    from rewards.pool import RewardPool
    from tandem_wire import enrollment

    config, rollout = prepared.config, prepared.config.rollout
    ray_cluster.connect(None)  # Ray's processes inherit the actor cores
    pool = RewardPool(config.rewards.spec(), config.rewards.num_workers)
    if split:
        pin_threads(split[1])  # the learner: this process, JAX's threads start after this
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(prepared.model_dir)
    key = enrollment.new_key()
    loop = build_rl_learner(prepared, tokenizer, enrollment_key=key)  # checkpoints only at the end
    trainer, service, checkpointer = loop.trainer, loop.service, loop.checkpointer
    address = loop.start("127.0.0.1:0")
    fleet = ActorFleet(config.actor_config(prepared.model_dir), address, pool.handles(), enrollment_key=key)
    fleet.scale(rollout.num_actors)
    marks: dict[str, tuple[float, dict[str, ActorStats]]] = {}
    waits: list[float] = []
    busy: list[float] = []  # the learner's update + weight publish, per measured step

    def snapshot() -> tuple[float, dict[str, ActorStats]]:
        stats = {a: ray.get(h.stats.remote()) for a, h in fleet.actors().items()}
        return time.perf_counter(), stats

    def on_step(step: int, metrics: dict[str, float]) -> None:
        if step == args.warmup:
            marks["start"] = snapshot()
        elif step > args.warmup:
            waits.append(metrics["learner_wait_s"])
            busy.append(metrics.get("learner_step_s", 0.0) + metrics.get("publish_s", 0.0))
        if step == args.steps:
            marks["end"] = snapshot()

    try:
        accounting = loop.run(on_step=on_step)
    finally:
        fleet.shutdown()
        pool.shutdown()
        service.stop()
        checkpointer.close()
    weight_bytes = sum(a.nbytes for _, a in trainer.hf_tensors())
    (t0, before), (t1, after) = marks["start"], marks["end"]
    wall = t1 - t0
    windows = [actor_window(before[a], after[a]) for a in after if a in before]
    tokens = sum(w["tokens_generated"] for w in windows)
    generate_s = sum(w["generate_seconds"] for w in windows)
    idle_keys = ("credit_wait_seconds", "prompt_wait_seconds", "stall_seconds")
    idle = [w["idle_seconds"] / wall for w in windows]
    pushes = [weight_bytes / (t + s) for w in windows for t, s in zip(w["transfer_seconds"], w["stalls"],
                                                                       strict=True)]
    result = {
        "wall_s": wall, "steps_per_min": (args.steps - args.warmup) / wall * 60,
        "learner_idle": sum(waits) / wall, "actor_idle": sum(idle) / len(idle),
        "learner_busy": sum(busy) / wall, "actor_busy": generate_s / wall / len(windows),
        "actor_idle_parts": {k: sum(w[k] for w in windows) / wall / len(windows) for k in idle_keys},
        "loop_tokens_per_s": tokens / wall, "actor_generate_tokens_per_s": tokens / generate_s,
        "weight_bytes": weight_bytes, "weight_updates": len(pushes),
        "push_bytes_per_s": sorted(pushes)[len(pushes) // 2] if pushes else None,
        "stall_fraction": sum(w["stall_seconds"] for w in windows) / generate_s,
        "stall_s_per_update": (sum(w["stall_seconds"] for w in windows) / len(pushes)) if pushes else None,
        "tcp_loopback_bytes_per_s": tcp_loopback_bytes_per_s(weight_bytes),
        "groups_stale": accounting.get("groups_stale", 0),
        # asynchrony's waste over the measured steps: tokens aborted by weight loads, and the tokens of
        # groups dropped as stale (whole run: the learner's ledger has no window), of all sampled
        "async_waste_fraction": (sum(w["tokens_aborted"] for w in windows) + accounting["tokens_stale_on_arrival"]
                                 + accounting["tokens_stale_at_dequeue"])
                                / max(1, tokens + sum(w["tokens_aborted"] for w in windows)),
        "groups_consumed": accounting.get("groups_consumed", 0),
    }
    ray.shutdown()
    return result


def measure_mode(mode: str, *, steps: int, warmup: int, overrides: list[str] = (), config: Path = DEMO_CONFIG,
                 standalone: bool = False, timeout_s: float = 1800) -> dict:
    """Run one mode in a fresh subprocess (its own Ray, its own pinning); returns its JSON result."""
    cmd = [sys.executable, __file__, "--mode", mode, "--steps", str(steps), "--warmup", str(warmup),
           "--config", str(config), *(["--standalone"] if standalone else []), *overrides]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=timeout_s)
    if proc.returncode != 0:
        raise RuntimeError(f"{mode} loop failed:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=("async", "sync"), required=True)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--config", default=str(DEMO_CONFIG))
    parser.add_argument("--standalone", action="store_true",
                        help="also time the engine alone on the same prompts")
    parser.add_argument("--standalone-batches", type=int, default=4)
    parser.add_argument("overrides", nargs="*", help="config key=value overrides")
    args = parser.parse_args()
    if not 0 < args.warmup < args.steps:
        parser.error("need 0 < --warmup < --steps")
    print(json.dumps(run(args)))


if __name__ == "__main__":
    main()

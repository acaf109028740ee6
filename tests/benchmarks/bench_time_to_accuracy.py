"""Wall-clock time to a held-out accuracy, and the accuracy reached, for each staleness bound η, from
the same SFT checkpoint.

    .venv/bin/python tests/benchmarks/bench_time_to_accuracy.py --model runs/demo/sft/hf_final \\
        --data runs/demo/data [--staleness 0 1 2 4 --steps 40 --eval-every 5 --targets 0.5 0.9 \\
        --seeds 0 1 --out runs/tta --pinned]

Runs the demo's RL stage (launch/configs/demo_rl.yaml, or --config) once per η and seed through
`launch/rl.py` (its own local Ray each time): η = 0 is the synchronous mode (rollout.sync=true,
max_staleness 0, one batch of prompts_per_step per version); η >= 1 is the asynchronous mode with
rollout.max_staleness = η. Held-out greedy accuracy is evaluated every --eval-every steps; the clock
is the run's training wall time (`wall_s`) less the evaluations (`eval_s`, during which the learner
waits), so every mode pays the same for being measured. Prints one JSON line: per run, the curve,
the final accuracy, the staleness histogram of the groups trained on (summed over steps) and the
first time at or above each of --targets; per η, the medians over seeds, and sync's time over each
η's. Writes `time_to_accuracy.png` (accuracy against minutes, one line per run) into --out.
With --pinned each run goes through pinned_rl.py instead: actors on one half of the cores, the
learner on the other, as deployed actors and learner have their own accelerators (unpinned, on a
2-core machine each phase of a synchronous run gets both cores, which no deployment gives it).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
DEMO_CONFIG = ROOT / "launch" / "configs" / "demo_rl.yaml"
GREEDY = "eval/pass@1_greedy"
# The demo's RL stage ends at its held-out target or a plateau; runs compared side by side run every step.
EVERY_STEP = ["train.stop_at=null", "train.stop_at_plateau=null"]


def mode_overrides(eta: int, prompts_per_step: int) -> list[str]:
    if eta == 0:
        return ["rollout.sync=true", "rollout.max_staleness=0", f"rollout.prompts_per_batch={prompts_per_step}"]
    return [f"rollout.max_staleness={eta}"]


def mode_name(eta: int) -> str:
    return "sync" if eta == 0 else f"async η={eta}"


def staleness_histogram(run_dir: Path) -> dict[str, float]:
    """Groups trained on k versions behind, summed over the run's steps (staleness_groups/k)."""
    total: dict[str, float] = {}
    for line in (run_dir / "tb" / "metrics.jsonl").read_text().splitlines():
        for key, value in json.loads(line).items():
            if key.startswith("staleness_groups/"):
                k = key.split("/", 1)[1]
                total[k] = total.get(k, 0.0) + value
    return dict(sorted(total.items(), key=lambda kv: int(kv[0])))


def curve(run_dir: Path) -> list[tuple[float, float]]:
    """(training minutes without evaluations, greedy accuracy) at each evaluation, in order."""
    points, eval_s = [], 0.0
    for line in (run_dir / "tb" / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        if GREEDY in row:
            points.append(((row["wall_s"] - eval_s) / 60, row[GREEDY]))  # evaluated after this wall_s
            eval_s += row.get("eval_s", 0.0)
    return points


def first_at(points: list[tuple[float, float]], target: float) -> float | None:
    return next((minutes for minutes, accuracy in points if accuracy >= target), None)


def run_one(args: argparse.Namespace, eta: int, seed: int, prompts_per_step: int) -> dict:
    run_dir = Path(args.out) / f"eta{eta}-seed{seed}"
    entry = Path(__file__).with_name("pinned_rl.py") if args.pinned else ROOT / "launch" / "rl.py"
    cmd = [sys.executable, str(entry), str(args.config), f"run_dir={run_dir}",
           f"seed={seed}", f"model.path={args.model}", f"data.dir={args.data}", f"train.steps={args.steps}",
           f"train.eval_every={args.eval_every}", f"train.checkpoint_every={args.steps}",
           f"rollout.fleet_name=tta-eta{eta}-{seed}", *EVERY_STEP, *mode_overrides(eta, prompts_per_step),
           *args.overrides]
    # every run compiles its steps: JAX's persistent cache would spare the runs after the first
    env = {**os.environ, "JAX_ENABLE_COMPILATION_CACHE": "false"}
    subprocess.run(cmd, check=True, cwd=ROOT, stdout=subprocess.DEVNULL, env=env)
    points = curve(run_dir)
    return {"eta": eta, "mode": mode_name(eta), "seed": seed, "curve": points,
            "final_accuracy": points[-1][1] if points else None, "staleness": staleness_histogram(run_dir),
            "minutes_to": {str(t): first_at(points, t) for t in args.targets}}


def median_or_none(values: list[float | None]) -> float | None:
    """The median, or None when any run never got there."""
    return statistics.median(values) if values and None not in values else None


def plot(runs: list[dict], targets: list[float], path: Path) -> None:
    fig, ax = plt.subplots(figsize=(7, 4))
    for run in runs:
        minutes, accuracy = zip(*run["curve"], strict=True) if run["curve"] else ((), ())
        ax.plot(minutes, accuracy, marker="o", color=f"C{run['eta']}", label=f"{run['mode']} seed {run['seed']}")
    for target in targets:
        ax.axhline(target, color="grey", linestyle="--", linewidth=1)
    ax.set_xlabel("training wall time (min, evaluations excluded)")
    ax.set_ylabel("held-out greedy pass@1")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="the SFT checkpoint (HF dir) both modes start from")
    parser.add_argument("--data", required=True, help="data.dir of the arithmetic task (make demo writes it)")
    parser.add_argument("--config", default=str(DEMO_CONFIG))
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--eval-every", type=int, default=5)
    parser.add_argument("--targets", type=float, nargs="+", default=[0.5, 0.9])
    parser.add_argument("--staleness", type=int, nargs="+", default=[0, 1],
                        help="η values to run: 0 = synchronous, k >= 1 = asynchronous with max_staleness k")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--out", default="runs/time_to_accuracy")
    parser.add_argument("--pinned", action="store_true",
                        help="actors and learner on separate halves of the cores (pinned_rl.py)")
    parser.add_argument("overrides", nargs="*", help="config key=value overrides for every run")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    from launch.config import load_config

    prompts_per_step = load_config(Path(args.config), list(args.overrides)).train.prompts_per_step
    Path(args.out).mkdir(parents=True, exist_ok=True)
    runs = [run_one(args, eta, seed, prompts_per_step) for seed in args.seeds for eta in args.staleness]
    summary = {}
    for eta in args.staleness:
        mine = [r for r in runs if r["eta"] == eta]
        finals = [r["final_accuracy"] for r in mine]
        summary[mode_name(eta)] = {
            "final_accuracy": {"median": median_or_none(finals),
                               "range": [min(finals), max(finals)] if None not in finals else None},
            "median_minutes_to": {str(t): median_or_none([r["minutes_to"][str(t)] for r in mine])
                                  for t in args.targets},
        }
    if 0 in args.staleness:  # sync's median time over each mode's: > 1 means faster than sync
        sync = summary[mode_name(0)]["median_minutes_to"]
        for entry in summary.values():
            entry["sync_over_this"] = {t: (sync[t] / m if sync[t] is not None and m else None)
                                       for t, m in entry["median_minutes_to"].items()}
    plot(runs, args.targets, Path(args.out) / "time_to_accuracy.png")
    print(json.dumps({"runs": runs, "modes": summary}))


if __name__ == "__main__":
    main()

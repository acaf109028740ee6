"""Wall-clock time to a held-out accuracy, asynchronous vs synchronous RL, from the same SFT checkpoint.

    .venv/bin/python tests/benchmarks/bench_time_to_accuracy.py --model runs/demo/sft/hf_final \\
        --data runs/demo/data [--steps 40 --eval-every 5 --targets 0.5 0.9 --seeds 0 1 --out runs/tta]

Runs the demo's RL stage (launch/configs/demo_rl.yaml, or --config) once per mode and seed through
`launch/rl.py` (its own local Ray each time): `async` as configured, `sync` with rollout.sync=true,
max_staleness 0 and one batch of prompts_per_step per version. Held-out greedy accuracy is evaluated
every --eval-every steps; the clock is the run's training wall time (`wall_s`) less the evaluations
(`eval_s`, during which the learner waits), so both modes pay the same for being measured. Prints
one JSON line (per run: the curve and the first time at or above each of --targets; per mode and
target: the median, and sync's median over async's) and writes `time_to_accuracy.png` (accuracy
against minutes, one line per run) into --out.
"""

from __future__ import annotations

import argparse
import json
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


def mode_overrides(mode: str, prompts_per_step: int) -> list[str]:
    if mode == "sync":
        return ["rollout.sync=true", "rollout.max_staleness=0", f"rollout.prompts_per_batch={prompts_per_step}"]
    return []


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


def run_one(args: argparse.Namespace, mode: str, seed: int, prompts_per_step: int) -> dict:
    run_dir = Path(args.out) / f"{mode}-seed{seed}"
    cmd = [sys.executable, str(ROOT / "launch" / "rl.py"), str(args.config), f"run_dir={run_dir}",
           f"seed={seed}", f"model.path={args.model}", f"data.dir={args.data}", f"train.steps={args.steps}",
           f"train.eval_every={args.eval_every}", f"train.checkpoint_every={args.steps}",
           f"rollout.fleet_name=tta-{mode}-{seed}", *mode_overrides(mode, prompts_per_step), *args.overrides]
    subprocess.run(cmd, check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    points = curve(run_dir)
    return {"mode": mode, "seed": seed, "curve": points,
            "minutes_to": {str(t): first_at(points, t) for t in args.targets}}


def plot(runs: list[dict], targets: list[float], path: Path) -> None:
    fig, ax = plt.subplots(figsize=(7, 4))
    for run in runs:
        minutes, accuracy = zip(*run["curve"], strict=True) if run["curve"] else ((), ())
        ax.plot(minutes, accuracy, marker="o", color="C0" if run["mode"] == "async" else "C1",
                label=f"{run['mode']} seed {run['seed']}")
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
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--out", default="runs/time_to_accuracy")
    parser.add_argument("overrides", nargs="*", help="config key=value overrides for both modes")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    from launch.config import load_config

    prompts_per_step = load_config(Path(args.config), list(args.overrides)).train.prompts_per_step
    Path(args.out).mkdir(parents=True, exist_ok=True)
    runs = [run_one(args, mode, seed, prompts_per_step) for seed in args.seeds for mode in ("async", "sync")]
    summary = {}
    for target in map(str, args.targets):
        medians = {}
        for mode in ("async", "sync"):
            times = [r["minutes_to"][target] for r in runs if r["mode"] == mode]
            medians[mode] = statistics.median(times) if None not in times else None  # None: not reached
        ratio = medians["sync"] / medians["async"] if None not in medians.values() else None
        summary[target] = {"median_minutes": medians, "sync_over_async": ratio}
    plot(runs, args.targets, Path(args.out) / "time_to_accuracy.png")
    print(json.dumps({"runs": runs, "targets": summary}))


if __name__ == "__main__":
    main()

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

In-flight weight updates (issue 51): `--weight-updates keep abort` runs each asynchronous η once per
`rollout.weight_update` policy (sync has nothing in flight and runs once), e.g. on the long-tailed chains
(launch/chains.py, launch/configs/chain_rl.yaml). Each run also reports RL steps per minute (training wall
time less evaluations), the completion tokens sampled per weight update and those discarded, apart: aborted
by an update (sampled again) and dropped as stale (a group's oldest token past the bound); the actors' idle
fraction (blocked on credits, on prompts, or stalled by a weight load, over the run's wall time, evaluations
included) with the stall and KV recompute per update, and the staleness histogram per trained token
(staleness_tokens/k). A finished run (its summary.json) is read again, not repeated, so an interrupted
comparison resumes.
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


def mode_overrides(eta: int, prompts_per_step: int, update: str | None) -> list[str]:
    if eta == 0:
        return ["rollout.sync=true", "rollout.max_staleness=0", f"rollout.prompts_per_batch={prompts_per_step}"]
    return [f"rollout.max_staleness={eta}", *([f"rollout.weight_update={update}"] if update else [])]


def mode_name(eta: int, update: str | None = None) -> str:
    return "sync" if eta == 0 else f"async η={eta}" + (f" {update}" if update else "")


def staleness_histogram(run_dir: Path, unit: str = "groups") -> dict[str, float]:
    """Groups (or tokens) trained on k versions behind, summed over the run's steps (staleness_<unit>/k)."""
    total: dict[str, float] = {}
    for line in (run_dir / "tb" / "metrics.jsonl").read_text().splitlines():
        for key, value in json.loads(line).items():
            if key.startswith(f"staleness_{unit}/"):
                k = key.split("/", 1)[1]
                total[k] = total.get(k, 0.0) + value
    return dict(sorted(total.items(), key=lambda kv: int(kv[0])))


def loop_numbers(run_dir: Path) -> dict[str, float | None]:
    """What the run's summary and metrics say of the loop: steps/min (evaluations excluded), tokens sampled
    and discarded per weight update, the actors' idle fraction, stall and KV recompute per update."""
    summary = json.loads((run_dir / "summary.json").read_text())
    rows = [json.loads(line) for line in (run_dir / "tb" / "metrics.jsonl").read_text().splitlines()]
    train_s = rows[-1]["wall_s"] - sum(r.get("eval_s", 0.0) for r in rows[:-1])
    actors = [a for a in summary["actors"].values() if "tokens_generated" in a]
    updates = sum(len(a["versions_applied"]) for a in actors)
    tokens = summary["tokens"]
    wasted = tokens["wasted"]

    def per_update(total: float) -> float | None:
        return total / updates if updates else None

    return {"steps_per_min": summary["steps"] / train_s * 60, "train_s": train_s, "weight_updates": updates,
            "tokens_sampled": tokens["sampled"], "tokens_discarded": wasted["aborted"] + wasted["stale"],
            "sampled_per_update": per_update(tokens["sampled"]),
            "aborted_per_update": per_update(wasted["aborted"]), "stale_per_update": per_update(wasted["stale"]),
            "actor_idle_fraction": statistics.fmean(a["idle_seconds"] for a in actors) / rows[-1]["wall_s"],
            "stall_s_per_update": per_update(sum(sum(a["stall_seconds"]) for a in actors)),
            "recompute_s_per_update": per_update(sum(a["recompute_seconds"] for a in actors))}


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


def run_one(args: argparse.Namespace, eta: int, seed: int, prompts_per_step: int, update: str | None) -> dict:
    name = f"eta{eta}-seed{seed}" if update is None else f"eta{eta}-{update}-seed{seed}"
    run_dir = Path(args.out) / name
    entry = Path(__file__).with_name("pinned_rl.py") if args.pinned else ROOT / "launch" / "rl.py"
    cmd = [sys.executable, str(entry), str(args.config), f"run_dir={run_dir}",
           f"seed={seed}", f"model.path={args.model}", f"data.dir={args.data}", f"train.steps={args.steps}",
           f"train.eval_every={args.eval_every}", f"train.checkpoint_every={args.steps}",
           f"rollout.fleet_name=tta-{name}", *EVERY_STEP, *mode_overrides(eta, prompts_per_step, update),
           *args.overrides]
    # every run compiles its steps: JAX's persistent cache would spare the runs after the first
    env = {**os.environ, "JAX_ENABLE_COMPILATION_CACHE": "false"}
    if not (run_dir / "summary.json").exists():  # a finished run is read again, not repeated
        subprocess.run(cmd, check=True, cwd=ROOT, stdout=subprocess.DEVNULL, env=env)
    points = curve(run_dir)
    return {"eta": eta, "update": update, "mode": mode_name(eta, update), "seed": seed, "curve": points,
            "final_accuracy": points[-1][1] if points else None, "staleness": staleness_histogram(run_dir),
            "token_staleness": staleness_histogram(run_dir, "tokens"), **loop_numbers(run_dir),
            "minutes_to": {str(t): first_at(points, t) for t in args.targets}}


def median_or_none(values: list[float | None]) -> float | None:
    """The median, or None when any run never got there."""
    return statistics.median(values) if values and None not in values else None


def plot(runs: list[dict], targets: list[float], path: Path) -> None:
    fig, ax = plt.subplots(figsize=(7, 4))
    colors: dict[str, str] = {}
    for run in runs:
        minutes, accuracy = zip(*run["curve"], strict=True) if run["curve"] else ((), ())
        ax.plot(minutes, accuracy, marker="o", color=colors.setdefault(run["mode"], f"C{len(colors)}"),
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
    parser.add_argument("--data", required=True, help="data.dir of the task (make demo writes the arithmetic's)")
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
    parser.add_argument("--weight-updates", nargs="+", choices=("keep", "abort"),
                        help="rollout.weight_update policies, one run each per asynchronous η (default: as configured)")
    parser.add_argument("overrides", nargs="*", help="config key=value overrides for every run")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    from launch.config import load_config

    prompts_per_step = load_config(Path(args.config), list(args.overrides)).train.prompts_per_step
    Path(args.out).mkdir(parents=True, exist_ok=True)
    modes = [(eta, None) if eta == 0 else (eta, update) for eta in args.staleness
             for update in (args.weight_updates or [None])]
    modes = list(dict.fromkeys(modes))  # sync once, whatever the policies
    runs = []
    for seed in args.seeds:
        for eta, update in modes:
            runs.append(run_one(args, eta, seed, prompts_per_step, update))
            print(json.dumps({k: v for k, v in runs[-1].items() if k != "curve"}), file=sys.stderr, flush=True)
    summary = {mode_name(eta, update): summarise([r for r in runs if (r["eta"], r["update"]) == (eta, update)],
                                                 args.targets) for eta, update in modes}
    if 0 in args.staleness:  # sync's median time and steps/min against each mode's: > 1 means faster than sync
        sync = summary[mode_name(0)]
        for entry in summary.values():
            entry["sync_over_this"] = {t: (sync["median_minutes_to"][t] / m
                                           if sync["median_minutes_to"][t] is not None and m else None)
                                       for t, m in entry["median_minutes_to"].items()}
            entry["steps_per_min_over_sync"] = entry["steps_per_min"]["median"] / sync["steps_per_min"]["median"]
    plot(runs, args.targets, Path(args.out) / "time_to_accuracy.png")
    print(json.dumps({"runs": runs, "modes": summary}))


def summarise(mine: list[dict], targets: list[float]) -> dict:
    """One mode's runs over the seeds: medians (and ranges) of accuracy, time to each target and the loop's
    numbers."""
    finals = [r["final_accuracy"] for r in mine]

    def spread(key: str) -> dict:
        values = [r[key] for r in mine if r[key] is not None]
        return {"median": statistics.median(values), "range": [min(values), max(values)]} if values else {}

    return {"final_accuracy": {"median": median_or_none(finals),
                               "range": [min(finals), max(finals)] if None not in finals else None},
            "median_minutes_to": {str(t): median_or_none([r["minutes_to"][str(t)] for r in mine]) for t in targets},
            **{key: spread(key) for key in ("steps_per_min", "sampled_per_update", "aborted_per_update",
                                            "stale_per_update", "actor_idle_fraction", "stall_s_per_update",
                                            "recompute_s_per_update")},
            "token_staleness": {k: sum(r["token_staleness"].get(k, 0.0) for r in mine)
                                for k in sorted({k for r in mine for k in r["token_staleness"]}, key=int)}}


if __name__ == "__main__":
    main()

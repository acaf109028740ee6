"""Off-policy corrections compared where staleness is real: the demo's RL stage, one run per η, correction, start.

At η = 4 (issue 40's table) and harder settings (a looser η, or `rollout.publish_every=4` as an extra override:
actors several updates behind; docs/benchmarks.md says why η = 8 was not harder on a 2-core machine).

    .venv/bin/python tests/benchmarks/bench_corrections.py --starts S0 S1 S2 --data D0 D1 D2 \\
        [--corrections none token_tis icepop token_mask seq_mask_geo offpolicy_seq_mask --etas 4 8 \\
         --out runs/corrections]

Each start (an SFT checkpoint, e.g. `runs/demo/sft/hf_selected` of `make demo DEMO_ARGS="--seed N"`, with that
seed's data dir) runs the demo's RL stage (launch/configs/demo_rl.yaml, held-out evaluation every 20) for all
of --steps steps (no early end at the demo's target) through `launch/rl.py` with rollout.max_staleness = η,
for each η of --etas, and `algo.correction` set to each kind at its defaults (learner/schema.py: IcePop at the
paper's band [0.5, 5], the token mask at [0.5, 2], DeepSeek-V3.2's mask at δ = 0.05); `none` is no correction.
Extra `key=value` arguments go to every run (e.g. `rollout.temperature=1.5` for actors sampling hotter than
the held-out evaluation's train.eval_temperature). Prints one JSON line: per run the curve (minutes without
evaluations, held-out greedy), the final accuracy, the first minute at or above --target, whether it collapsed
(an evaluation --collapse or more below the best one before it) and its off-policy picture (means over steps
of staleness, is_ess, kl_old_behaviour, masked and capped fractions); per η and correction the medians and
ranges over the starts and the count of collapses. Minutes move with the machine's load; steps to --target
(evaluated every 20) do not. A finished run (its summary.json) is read again, not repeated, so an interrupted
table resumes.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_time_to_accuracy import DEMO_CONFIG, EVERY_STEP, GREEDY, ROOT, curve, first_at, median_or_none  # noqa: E402

PICTURE = ("staleness_mean", "is_ess", "kl_old_behaviour", "masked_token_frac", "capped_token_frac", "is_weight_mean",
           "log_ratio_clamped_frac")
CORRECTIONS = ("none", "token_tis", "icepop", "token_mask", "seq_mask_geo", "offpolicy_seq_mask")


def correction_override(kind: str) -> list[str]:
    return [] if kind == "none" else [f"algo.correction={{kind: {kind}}}"]


def collapsed(points: list[tuple[float, float]], drop: float) -> bool:
    """Whether some evaluation fell `drop` or more below the best evaluation before it."""
    best = -1.0
    for _, accuracy in points:
        if accuracy <= best - drop:
            return True
        best = max(best, accuracy)
    return False


def picture(run_dir: Path) -> dict[str, float]:
    """Means over the run's updates of the off-policy metrics."""
    rows = [json.loads(line) for line in (run_dir / "tb" / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if not r.get("update_skipped")]
    return {key: statistics.fmean(r[key] for r in rows if key in r) for key in PICTURE if any(key in r for r in rows)}


def run_one(args: argparse.Namespace, eta: int, kind: str, index: int) -> dict:
    start, data = args.starts[index], args.data[index]
    run_dir = Path(args.out) / f"eta{eta}" / f"{kind}-start{index}"
    cmd = [sys.executable, str(ROOT / "launch" / "rl.py"), str(DEMO_CONFIG), f"run_dir={run_dir}",
           f"seed={index}", f"model.path={start}", f"train.steps={args.steps}", f"data.dir={data}",
           f"rollout.max_staleness={eta}",
           f"rollout.fleet_name=corrections-{eta}-{kind}-{index}", *EVERY_STEP, *correction_override(kind),
           *args.overrides]
    # every run compiles its steps: JAX's persistent cache would spare the runs after the first
    env = {**os.environ, "JAX_ENABLE_COMPILATION_CACHE": "false"}
    if not (run_dir / "summary.json").exists():  # a finished run is read again, not repeated
        subprocess.run(cmd, check=True, cwd=ROOT, stdout=subprocess.DEVNULL, env=env, timeout=args.run_timeout_s)
    points = curve(run_dir)
    return {"eta": eta, "correction": kind, "start": index, "curve": points, "final_accuracy": points[-1][1],
            "minutes_to_target": first_at(points, args.target), "steps_to_target": steps_to(run_dir, args.target),
            "collapsed": collapsed(points, args.collapse), **picture(run_dir)}


def steps_to(run_dir: Path, target: float) -> int | None:
    """The first step whose held-out evaluation is at or above `target` (a clock a loaded machine keeps)."""
    for line in (run_dir / "tb" / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        if row.get(GREEDY, -1.0) >= target:
            return row["step"]
    return None


def summarise(mine: list[dict]) -> dict:
    """One setting's runs over the starts: medians and ranges, collapses, the off-policy picture's medians."""
    finals = [r["final_accuracy"] for r in mine]
    return {"final_accuracy": {"median": statistics.median(finals), "range": [min(finals), max(finals)]},
            "minutes_to_target": {"median": median_or_none([r["minutes_to_target"] for r in mine]),
                                  "each": [r["minutes_to_target"] for r in mine]},
            "steps_to_target": {"median": median_or_none([r["steps_to_target"] for r in mine]),
                                "each": [r["steps_to_target"] for r in mine]},
            "collapses": sum(r["collapsed"] for r in mine), "runs": len(mine),
            **{key: statistics.median(r[key] for r in mine if key in r) for key in PICTURE
               if any(key in r for r in mine)}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--starts", nargs="+", required=True, help="SFT checkpoints (HF dirs), one per seed")
    parser.add_argument("--data", nargs="+", required=True, help="each start's data.dir")
    parser.add_argument("--corrections", nargs="+", default=list(CORRECTIONS), choices=CORRECTIONS)
    parser.add_argument("--etas", nargs="+", type=int, default=[4], help="rollout.max_staleness, one setting each")
    parser.add_argument("--steps", type=int, default=200, help="train.steps of every run")
    parser.add_argument("--target", type=float, default=0.9)
    parser.add_argument("--collapse", type=float, default=0.2)
    parser.add_argument("--out", default="runs/corrections")
    parser.add_argument("--run-timeout-s", type=float, default=5400, help="a run that has not finished by then fails")
    parser.add_argument("overrides", nargs="*", help="config key=value overrides for every run")
    args = parser.parse_args()
    if len(args.starts) != len(args.data):
        parser.error("one --data dir per --starts checkpoint")
    Path(args.out).mkdir(parents=True, exist_ok=True)
    runs = []
    for eta in args.etas:
        for index in range(len(args.starts)):
            for kind in args.corrections:
                runs.append(run_one(args, eta, kind, index))
                print(json.dumps({k: v for k, v in runs[-1].items() if k != "curve"}), file=sys.stderr, flush=True)
    summary = {f"eta{eta}/{kind}": summarise([r for r in runs if r["eta"] == eta and r["correction"] == kind])
               for eta in args.etas for kind in args.corrections}
    print(json.dumps({"runs": runs, "corrections": summary}))


if __name__ == "__main__":
    main()

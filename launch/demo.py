"""The embedded demo (`make demo`): pretrain → SFT → RL (GRPO) on a synthetic addition task.

A 0.6M-parameter Qwen2-shaped model is created from scratch, pretrained on "123+456=579" lines,
fine-tuned briefly on chat-formatted sums, then trained with GRPO by vLLM rollout actors on Ray.
After each stage it prints held-out accuracy (pairs excluded from every stage): greedy pass@1,
the pass rate of samples at T=1, and pass@8. Each stage is the ordinary entrypoint's run
(launch/pretrain.py, launch/sft.py, launch/rl.py with launch/configs/demo_*.yaml); the next stage
starts from the previous one's exported HF dir.

    python launch/demo.py                      # ~20 min on 2 CPU cores
    python launch/demo.py --quick              # a few steps per stage: checks the plumbing only
    python launch/demo.py rl.train.steps=200   # per-stage overrides: <stage>.<key>=<value>
"""

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from any directory

from launch.config import ConfigError, load_config  # noqa: E402
from launch.stages import MODES, prepare, run_rl_mode, run_supervised_mode, setup_process  # noqa: E402

CONFIGS = Path(__file__).resolve().parent / "configs"
QUICK = {  # enough to exercise every stage, not to learn
    "pretrain": ["train.steps=20", "optim.warmup_steps=2", "data.eval_examples=32"],
    "sft": ["train.steps=5", "data.eval_examples=32"],
    "rl": ["train.steps=3", "train.prompts_per_step=8", "optim.warmup_steps=0", "train.eval_every=0",
           "data.eval_examples=32"],
}


def stage_overrides(args: argparse.Namespace, stage: str, previous_hf: str | None) -> list[str]:
    overrides = [f"run_dir={args.run_dir}/{stage}", f"data.dir={args.run_dir}/data"]
    if previous_hf is not None:
        overrides.append(f"model.path={previous_hf}")
    if args.quick:
        overrides += QUICK[stage]
    prefix = f"{stage}."
    return overrides + [o[len(prefix):] for o in args.overrides if o.startswith(prefix)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run-dir", default="runs/demo", help="where every stage writes (wiped first)")
    parser.add_argument("--quick", action="store_true", help="a few steps per stage (plumbing check)")
    parser.add_argument("overrides", nargs="*", help="<stage>.<key>=<value>, stage in pretrain|sft|rl")
    args = parser.parse_args(argv)
    setup_process()
    unknown = [o for o in args.overrides if o.split(".", 1)[0] not in MODES]
    if unknown:
        parser.error(f"overrides must start with a stage name {MODES}: {unknown}")
    shutil.rmtree(args.run_dir, ignore_errors=True)  # the demo always starts from scratch

    results, previous_hf = {}, None
    for stage in MODES:
        started = time.monotonic()
        try:
            config = load_config(CONFIGS / f"demo_{stage}.yaml", stage_overrides(args, stage, previous_hf))
        except ConfigError as error:
            print(f"error in stage {stage}: {error}")
            return 2
        run = prepare(config, stage)
        summary = run_rl_mode(run) if stage == "rl" else run_supervised_mode(run, stage)
        previous_hf = summary["hf_final"]
        results[stage] = {**summary["eval"], "minutes": (time.monotonic() - started) / 60}
        print(f"\n=== after {stage}: {json.dumps(results[stage])}\n", flush=True)

    print("held-out accuracy (pairs never seen in training)")
    print(f"{'stage':<10}{'greedy pass@1':>15}{'T=1 pass rate':>15}{'pass@8':>10}{'minutes':>10}")
    for stage, r in results.items():
        print(f"{stage:<10}{r['pass@1_greedy']:>15.3f}{r['pass_rate_t1']:>15.3f}{r['pass@8']:>10.3f}"
              f"{r['minutes']:>10.1f}")
    Path(args.run_dir, "demo_results.json").write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

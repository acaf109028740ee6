"""The embedded demo (`make demo`): pretrain → SFT → RL (GRPO) on synthetic arithmetic.

A Qwen2-shaped model is created from scratch and
  1. pretrained on plain-text sums and differences ("12+34=46", "46-12=34") to its plateau;
  2. fine-tuned on the chat format with *sums only* ("<user>12+34<asst>" → "46<eos>"), evaluated every
     10 steps; the RL stage starts from the last evaluated step that leaves it room (held-out greedy
     ≤ 0.30 while pass@8 ≥ 0.10: `train.handoff` in launch/configs/demo_sft.yaml);
  3. trained with GRPO by vLLM rollout actors on Ray on chat-format *differences*, which no
     supervised example shows: only the verifier (exact match) says which answer is right.
After each stage it prints held-out accuracy (pairs excluded from every stage) on the RL task
(greedy pass@1, the pass rate of samples at T=1, pass@8), plus greedy accuracy on plain-text
differences (what pretraining knows) and on chat-format sums (what SFT taught). Each stage is the
ordinary entrypoint's run (launch/pretrain.py, launch/sft.py, launch/rl.py with
launch/configs/demo_*.yaml); the next stage starts from the previous one's exported HF dir. Each
stage's run dir gets curves.png; the demo's run dir gets demo.png and demo_results.json.

    python launch/demo.py                      # 6-15 min on 2 CPU cores
    python launch/demo.py --seed 1             # another seed: data, initial weights, sampling
    python launch/demo.py --quick              # a few steps per stage: checks the plumbing only
    python launch/demo.py rl.train.steps=200   # per-stage overrides: <stage>.<key>=<value>
    python launch/demo.py rl.model.lora.rank=16 rl.optim.learning_rate=3e-3   # RL with LoRA (docs/lora.md)
    python launch/demo.py logging.wandb.mode=offline   # logging.* overrides go to every stage (docs/tracking.md)

With a tracker on (`logging`), each stage is a run of its own and the demo's run (named after its run
dir) gets each stage's held-out scores and demo.png.
"""

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from any directory

from transformers import AutoTokenizer  # noqa: E402

from launch.config import ConfigError, config_help, load_config  # noqa: E402
from launch.evaluation import evaluate_dir  # noqa: E402
from launch.plots import plot_demo  # noqa: E402
from launch.run import MODES, Run, prepare, setup_process  # noqa: E402
from launch.stages import run_mode  # noqa: E402
from launch.tracking import report_demo  # noqa: E402

CONFIGS = Path(__file__).resolve().parent / "configs"
EVERY_STAGE = "logging."  # overrides with this prefix (the experiment trackers) go to every stage
QUICK = {  # enough to exercise every stage, not to learn
    "pretrain": ["train.steps=20", "optim.warmup_steps=2", "data.eval_examples=32"],
    "sft": ["train.steps=5", "train.eval_every=5", "data.eval_examples=32"],
    "rl": ["train.steps=3", "train.prompts_per_step=8", "rollout.prompts_per_batch=8", "optim.warmup_steps=0",
           "train.eval_every=0", "data.eval_examples=32"],
}


def stage_overrides(args: argparse.Namespace, stage: str, previous_hf: str | None) -> list[str]:
    overrides = [f"run_dir={args.run_dir}/{stage}", f"data.dir={args.run_dir}/data", f"seed={args.seed}"]
    if previous_hf is not None:
        overrides.append(f"model.path={previous_hf}")
    if args.quick:
        overrides += QUICK[stage]
    prefix = f"{stage}."
    return overrides + [o[len(prefix):] if o.startswith(prefix) else o for o in args.overrides
                        if o.startswith((prefix, EVERY_STAGE))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="Keys an override sets (after its stage prefix), their defaults "
                                            "and what they do:\n\n" + config_help())
    parser.add_argument("--run-dir", default="runs/demo", help="where every stage writes (wiped first)")
    parser.add_argument("--quick", action="store_true", help="a few steps per stage (plumbing check)")
    parser.add_argument("--seed", type=int, default=0, help="seed of every stage (data, weights, sampling)")
    parser.add_argument("overrides", nargs="*", help="<stage>.<key>=<value>, stage in pretrain|sft|rl; "
                                                     "logging.<key>=<value> for every stage")
    args = parser.parse_args(argv)
    setup_process()
    unknown = [o for o in args.overrides if o.split(".", 1)[0] not in MODES and not o.startswith(EVERY_STAGE)]
    if unknown:
        parser.error(f"overrides must start with a stage name {MODES} or {EVERY_STAGE!r}: {unknown}")
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
        summary = run_mode(run, stage)
        previous_hf, scores = handed_off(summary)
        results[stage] = {**scores, **other_tasks(run, Path(previous_hf)), "steps": summary["steps"],
                          "minutes": (time.monotonic() - started) / 60}
        print(f"\n=== after {stage}: {json.dumps(results[stage])}\n", flush=True)
        if summary.get("finished_early"):
            print(f"{stage} {summary['finished_early']}", flush=True)

    print(results_table(results))
    if "start_step" in results["sft"]:
        print(f"the RL stage started from SFT step {results['sft']['start_step']} (train.handoff)")
    Path(args.run_dir, "demo_results.json").write_text(json.dumps(results, indent=2))
    figure = plot_demo({stage: Path(args.run_dir) / stage for stage in MODES}, results,
                       Path(args.run_dir) / "demo.png")
    print(f"curves: {figure} and {args.run_dir}/<stage>/curves.png")
    report_demo(config.logging, Path(args.run_dir).absolute(), results, figure)
    return 0


def handed_off(summary: dict) -> tuple[str, dict[str, float]]:
    """The HF dir the next stage starts from and its held-out scores: the step train.handoff chose (with
    `start_step`), else the stage's final export."""
    handoff = summary.get("handoff")
    if handoff is None:
        return summary["hf_final"], summary["eval"]
    if handoff["step"] is None:
        print(f"warning: no evaluated step met the handoff rule {handoff['rule']}; the next stage starts "
              f"from the final export", flush=True)
        return summary["hf_final"], summary["eval"]
    return handoff["hf_selected"], {**handoff["eval"], "start_step": handoff["step"]}


def other_tasks(run: Run, hf_dir: Path) -> dict[str, float]:
    """Greedy held-out accuracy on what the earlier stages taught: plain-text differences
    (pretraining) and chat-format sums (SFT)."""
    tokenizer = AutoTokenizer.from_pretrained(hf_dir)
    data_dir = Path(run.config.data.dir)
    raw = evaluate_dir(run, tokenizer, hf_dir, data=str(data_dir / "heldout_raw.jsonl"), prompt_format="raw", k=1)
    chat_sums = evaluate_dir(run, tokenizer, hf_dir, data=str(data_dir / "heldout_addition.jsonl"), k=1)
    return {"raw_difference_greedy": raw["pass@1_greedy"], "chat_sum_greedy": chat_sums["pass@1_greedy"]}


def results_table(results: dict[str, dict[str, float]]) -> str:
    columns = [("pass@1_greedy", "greedy"), ("pass_rate_t1", "T=1 rate"), ("pass@8", "pass@8"),
               ("raw_difference_greedy", "a-b= greedy"), ("chat_sum_greedy", "chat a+b greedy"),
               ("minutes", "minutes")]
    lines = ["held-out accuracy (pairs never seen in training); the RL task is chat-format a-b",
             f"{'stage':<10}" + "".join(f"{title:>17}" for _, title in columns)]
    for stage, r in results.items():
        lines.append(f"{stage:<10}" + "".join(f"{r[key]:>17.3f}" for key, _ in columns))
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())

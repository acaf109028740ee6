"""One short run of the real-model RL path on an accelerator, printing what a CPU cannot measure:
model FLOPs utilisation, learner step time, weight-sync time and the training–inference logprob gap.

    python launch/device_check.py [--model-dir HF_DIR] [--layers 24] [--steps 6] [--prompts 8]
        [--group-size 8] [--max-tokens 256] [--peak-tflops N] [--run-dir DIR] [key=value ...]

It runs launch/configs/qwen_gsm8k_gpu.yaml (bf16 compute, float32 master weights, GSPO) as shipped but
for the sizes: one vLLM rollout actor, one reward worker, GSM8K-shaped rows made here. Without
--model-dir it makes a Qwen2.5-0.5B-shaped checkpoint with random weights (models.tiny: the real widths
and 151,936-token vocabulary, --layers of its 24) and rewards a format a random model meets about half
the time, so every step updates; with --model-dir (a real checkpoint) the config's math_answer stays.
Trailing key=value pairs override the config (e.g. mesh.tp=2 train.remat=full).

Printed (steps after the first, which compiles): learner step seconds and tokens/s, MFU =
(6·N + 12·L·d·T) FLOPs per trained token × tokens/s / peak (N parameters, L layers, d = heads × head_dim,
T the mean sequence length; peak from --peak-tflops or the device kind's bf16 dense figure), the publish
time per version on the learner and the actor's transfer and stall per version, and behaviour_gap at
step 1 (token-mean |log π_learner − log π_vLLM| of on-policy tokens). On a CPU it runs too (slowly):
`--layers 2 --steps 2 --prompts 2 --group-size 4 --max-tokens 8` is the smoke size.

    python launch/device_check.py --learner [--json out.json]

runs the learner alone instead (no vLLM, no Ray): its SFT and RL steps at Qwen2.5-0.5B's and 1.5B's
shapes against a transformers + torch step on the same tokens, with MFU against the spec and against
the matmul ceiling measured in the same run (tests/benchmarks/bench_learner.py, which takes the sizes).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from launch.json_files import write_report  # noqa: E402
from launch.real_shape import CONFIG, RANDOM_MODEL_REWARD, rl_overrides, write_gsm8k_style_data  # noqa: E402

# bf16 dense peak TFLOP/s by jax device_kind (vendor figures); others need --peak-tflops.
PEAK_TFLOPS = {"NVIDIA H100 80GB HBM3": 989.0, "NVIDIA H200": 989.0, "NVIDIA A100-SXM4-80GB": 312.0,
               "NVIDIA A100-SXM4-40GB": 312.0, "TPU v4": 275.0, "TPU v5 lite": 197.0, "TPU v5e": 197.0,
               "TPU v5p": 459.0, "TPU v6 lite": 918.0, "TPU v6e": 918.0}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="launch/device_check.py", description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", type=Path, help="a real HF checkpoint (default: a random one of "
                                                       "Qwen2.5-0.5B's shape)")
    parser.add_argument("--layers", type=int, default=24, help="layers of the random checkpoint")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--prompts", type=int, default=8, help="prompts per step")
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--peak-tflops", type=float, help="the device's peak for MFU (default: by kind)")
    parser.add_argument("--run-dir", type=Path, help="default: a temporary dir")
    parser.add_argument("--json", type=Path, help="also write the report here")
    parser.add_argument("--learner", action="store_true", help="the learner alone at real shapes vs a "
                                                               "transformers step (tests/benchmarks/bench_learner.py)")
    parser.add_argument("overrides", nargs="*", help="key=value overrides of the config")
    return parser.parse_args(argv)


def flops_per_token(hf_config: dict, mean_sequence: float) -> float:
    """Training FLOPs per token: 6 per parameter (forward + backward matmuls, the tied or untied output
    head included) plus causal attention's 12·L·d·T (scores and values, forward + backward)."""
    d, f, v, layers = (hf_config[k] for k in ("hidden_size", "intermediate_size", "vocab_size", "num_hidden_layers"))
    heads, kv_heads = hf_config["num_attention_heads"], hf_config["num_key_value_heads"]
    head_dim = hf_config.get("head_dim") or d // heads
    per_layer = d * heads * head_dim * 2 + 2 * d * kv_heads * head_dim + 3 * d * f
    matmul_params = layers * per_layer + v * d
    return 6 * matmul_params + 12 * layers * heads * head_dim * mean_sequence


def report(run_dir: Path, summary: dict, hf_config: dict, *, group_size: int, peak_tflops: float | None) -> dict:
    """The figures of a finished run (its metrics.jsonl and summary); steps after the first."""
    rows = [json.loads(line) for line in (run_dir / "tb" / "metrics.jsonl").read_text().splitlines() if line]
    timed = rows[1:] or rows

    def median(key: str) -> float:
        return statistics.median(r[key] for r in timed)

    tokens_per_s = median("tokens_per_s")  # every token of the batch (prompt and completion) runs fwd + bwd
    mean_sequence = statistics.median(r["tokens_per_s"] * r["step_time_s"] / (r["num_groups"] * group_size)
                                      for r in timed)
    actor = next(iter(summary["actors"].values()))
    flops = flops_per_token(hf_config, mean_sequence) * tokens_per_s
    return {"device": device_kind(), "steps": len(rows), "learner_step_s": median("learner_step_s"),
            "tokens_per_s": tokens_per_s, "mean_sequence": mean_sequence, "model_tflops_per_s": flops / 1e12,
            "mfu": flops / (peak_tflops * 1e12) if peak_tflops else None, "publish_s": median("publish_s"),
            "actor_transfer_s": statistics.median(actor["transfer_seconds"] or [0.0]),
            "actor_stall_s": statistics.median(actor["stall_seconds"] or [0.0]),
            "actor_tokens_per_s": actor["tokens_per_second"], "behaviour_gap_step1": rows[0]["behaviour_gap"],
            "clip_frac_step1": rows[0]["clip_frac_low"] + rows[0]["clip_frac_high"]}


def device_kind() -> str:
    import jax

    return jax.devices()[0].device_kind


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.learner:
        sys.path.insert(0, str(ROOT / "tests" / "benchmarks"))
        import bench_learner

        return bench_learner.main([*(["--json", str(args.json)] if args.json else [])])
    from launch.config import load_config
    from launch.run import prepare, setup_process
    from launch.stages import run_mode
    from models.tiny import make_chatml_model

    setup_process()
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = (args.run_dir or Path(tmp) / "run").absolute()
        data = write_gsm8k_style_data(Path(tmp) / "data", train=max(64, 4 * args.prompts), held_out=8)
        model_dir = args.model_dir or make_chatml_model(Path(tmp) / "model", num_layers=args.layers)
        reward = [] if args.model_dir else [RANDOM_MODEL_REWARD]
        config = load_config(CONFIG, [
            f"run_dir={run_dir}", f"model.path={model_dir}", f"data.train={data['train']}",
            f"data.eval={data['eval']}", "data.eval_examples=8", f"train.steps={args.steps}",
            "train.micro_batches=1", f"train.checkpoint_every={args.steps}", f"rollout.max_tokens={args.max_tokens}",
            *rl_overrides(prompts=args.prompts, group_size=args.group_size, fleet_name="device-check"),
            *reward, *args.overrides])
        summary = run_mode(prepare(config, "rl"), "rl")
        hf_config = json.loads((Path(model_dir) / "config.json").read_text())
        peak = args.peak_tflops or PEAK_TFLOPS.get(device_kind())
        figures = report(run_dir, summary, hf_config, group_size=args.group_size, peak_tflops=peak)
    print(json.dumps(figures, indent=2))
    write_report(args.json, figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())

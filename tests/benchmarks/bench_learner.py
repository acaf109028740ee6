"""The learner's step at real model shapes, against a transformers + torch step on the same shapes and
tokens (issue 38). Needs neither vLLM nor Ray: `launch/bench.py --only learner` and
`launch/device_check.py --learner` run it.

    .venv/bin/python tests/benchmarks/bench_learner.py [--shapes 0.5b 1.5b] [--kinds sft rl] [--rows 32]
        [--seq 1024] [--layers N] [--steps 3] [--remat save_matmuls] [--attention auto] [--json out.json]

Per shape (Qwen2.5-0.5B, Qwen2.5-1.5B: widths, heads, 151,936-token vocabulary; random weights built in
memory; `--layers` fewer layers for a smoke run) and kind (sft: cross-entropy on the second half of each
row; rl: the GRPO loss on a batch of the same tokens), `--steps` timed steps after a compile step, mixed
precision (float32 master, bf16 compute) and the config's defaults unless given:
  tokens/s        rows × seq / step seconds, beside the transformers step's (Qwen2ForCausalLM, fp32 master
                  + bf16 autocast, SDPA attention, fused AdamW on CUDA: what TRL runs), whose ratio is the row's
  MFU             (6·N + 12·L·d·T) FLOPs per token × tokens/s (launch/device_check.flops_per_token) against
                  the device's bf16 spec (device_check.PEAK_TFLOPS) and against its matmul ceiling measured
                  in the same run (a bf16 8192³ jnp.dot, best of 10)
  peak memory     the device's peak bytes in use (GPUs; on CPU XLA's account of the compiled step), against
                  the analytic floor (bench_real_shape.floor_bytes: master weights, gradients, AdamW's
                  moments, the bf16 copy, each layer's input, one logits chunk)
Each side runs in a child process of its own (so their memory peaks do not add up), JAX first.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "benchmarks")]

from launch.json_files import write_report  # noqa: E402

GIB = 2**30


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="+", default=["0.5b", "1.5b"], choices=("0.5b", "1.5b"))
    parser.add_argument("--kinds", nargs="+", default=["sft", "rl"], choices=("sft", "rl"))
    parser.add_argument("--rows", type=int, default=32)
    parser.add_argument("--seq", type=int, default=1024)
    parser.add_argument("--layers", type=int, help="fewer layers than the shape's (smoke runs)")
    parser.add_argument("--steps", type=int, default=3, help="timed steps after the compile step")
    parser.add_argument("--remat", help="train.remat (default: the config's)")
    parser.add_argument("--attention", default="auto", help="train.attention")
    parser.add_argument("--chunk-tokens", type=int, help="train.logits_chunk_tokens (default: the config's)")
    parser.add_argument("--no-torch", action="store_true", help="skip the transformers step")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--child", choices=("jax", "torch"), help=argparse.SUPPRESS)
    parser.add_argument("--shape", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def hf_config(shape: str, layers: int | None) -> dict:
    from models.tiny import QWEN2_5_0_5B, QWEN2_5_1_5B, tiny_hf_config

    dims = {"0.5b": QWEN2_5_0_5B, "1.5b": QWEN2_5_1_5B}[shape]
    return tiny_hf_config(family="qwen2", **{**dims, "num_layers": layers or dims["num_layers"]},
                          special_ids=(0, 1, 0))


def tokens(rows: int, seq: int) -> np.ndarray:
    return np.random.default_rng(0).integers(2, 151_000, (rows, seq)).astype(np.int32)


def batches(rows: int, seq: int) -> dict:
    """The SFT batch (loss on each row's second half) and an RL batch of the same tokens."""
    from learner.algo.rl_batch import empty_rl_batch
    from learner.data import TokenBatch

    ids = tokens(rows, seq)
    loss = np.zeros((rows, seq), np.float32)
    loss[:, seq // 2:] = 1
    ones = np.ones((rows, seq), np.int32)
    positions = np.broadcast_to(np.arange(seq, dtype=np.int32), (rows, seq)).copy()
    rl = empty_rl_batch(rows, seq)._replace(input_ids=ids, attention_mask=ones, segment_ids=ones.copy(),
                                            positions=positions)  # one sequence a row
    completion = np.zeros((rows, seq), np.float32)
    completion[:, seq // 4:] = 1
    advantages = np.random.default_rng(1).standard_normal((rows, 1)).astype(np.float32) * completion
    rl = rl._replace(completion_mask=completion, advantages=advantages,
                     behaviour_logps=np.where(completion > 0, -11.9, 0).astype(np.float32))
    return {"sft": TokenBatch(ids, ones, loss, ones.copy(), positions), "rl": rl}


def matmul_tflops() -> float:
    """The device's bf16 matmul ceiling: an 8192³ (CPU: 2048³) jnp.dot, best of 10."""
    import jax
    import jax.numpy as jnp

    n = 8192 if jax.default_backend() != "cpu" else 2048
    a = jax.random.normal(jax.random.key(0), (n, n), jnp.bfloat16)
    dot = jax.jit(lambda a, b: a @ b)
    dot(a, a).block_until_ready()
    best = float("inf")
    for _ in range(10):
        started = time.perf_counter()
        dot(a, a).block_until_ready()
        best = min(best, time.perf_counter() - started)
    return 2 * n**3 / best / 1e12


def jax_side(args: argparse.Namespace) -> dict:
    """The learner's steps at one shape: compile, time, memory, and the device's matmul ceiling."""
    import jax
    from bench_real_shape import compiled_memory, floor_bytes
    from flax import nnx

    from launch.device_check import PEAK_TFLOPS, flops_per_token
    from learner.algo.optim import OptimizerConfig
    from learner.algo.train_step import Trainer
    from learner.schema import TrainConfig
    from models.jax_model import LoadedModel, make_mesh
    from models.tunix_families import MODEL_CLASSES, tunix_config

    config = hf_config(args.shape, args.layers)
    defaults = TrainConfig()
    mesh = make_mesh(1, 1)
    model = MODEL_CLASSES["qwen2"](tunix_config(config), rngs=nnx.Rngs(0))
    trainer = Trainer(LoadedModel(model, "qwen2", config, tunix_config(config)), mesh,
                      OptimizerConfig(learning_rate=1e-6, schedule="constant"), compute_dtype="bfloat16",
                      chunk_tokens=args.chunk_tokens or defaults.logits_chunk_tokens,
                      remat=args.remat or defaults.remat, attention=args.attention, skip_no_signal=False)
    n_params = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(trainer.state.params))
    device = jax.devices()[0]
    out = {"device": device.device_kind, "backend": jax.default_backend(), "jax": jax.__version__,
           "params": n_params, "matmul_tflops": matmul_tflops(),
           "spec_tflops": PEAK_TFLOPS.get(device.device_kind), "kinds": {}}
    tokens_per_step = args.rows * args.seq
    floor = floor_bytes(n_params, "mixed", layers=config["num_hidden_layers"], tokens=tokens_per_step,
                        hidden=config["hidden_size"], vocab=config["vocab_size"], chunk_tokens=trainer.chunk_tokens)
    for kind, batch in batches(args.rows, args.seq).items():
        if kind not in args.kinds:
            continue
        step = trainer.sft_step if kind == "sft" else trainer.rl_step
        analysis = compiled_memory(trainer, kind, batch._asdict())
        started = time.perf_counter()
        first = step(batch)
        compile_s = time.perf_counter() - started
        started = time.perf_counter()
        for _ in range(args.steps):
            metrics = step(batch)
        step_s = (time.perf_counter() - started) / args.steps
        stats = device.memory_stats() or {}
        tps = tokens_per_step / step_s
        flops = flops_per_token(config, args.seq) * tps / 1e12
        out["kinds"][kind] = {
            "compile_s": compile_s, "step_s": step_s, "tokens_per_s": tps, "model_tflops_per_s": flops,
            "mfu_spec": flops / out["spec_tflops"] if out["spec_tflops"] else None,
            "mfu_measured": flops / out["matmul_tflops"],
            "peak_bytes": stats.get("peak_bytes_in_use"),
            "xla_bytes": analysis.argument_size_in_bytes + analysis.temp_size_in_bytes, "floor_bytes": floor,
            "loss": [first["loss"], metrics["loss"]]}
        print(f"[learner] {args.shape} {kind}: {step_s:.3f} s/step, {tps:.0f} tok/s", file=sys.stderr, flush=True)
    out["remat"] = sorted({plan.remat for plan in trainer.plans.values()}) if trainer.remat == "auto" else trainer.remat
    out["attention"] = trainer.loaded.model.attention_impl
    return out


def torch_side(args: argparse.Namespace) -> dict:
    """transformers' Qwen2ForCausalLM SFT step on the same tokens: fp32 master, bf16 autocast, SDPA,
    (fused, on CUDA) AdamW and clipping, as TRL runs it."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    config = Qwen2Config(**{k: v for k, v in hf_config(args.shape, args.layers).items() if k != "architectures"})
    model = Qwen2ForCausalLM._from_config(config, attn_implementation="sdpa", torch_dtype=torch.float32).to(dev)
    model.config.use_cache = False
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6, fused=dev == "cuda")
    ids = torch.tensor(tokens(args.rows, args.seq), device=dev, dtype=torch.long)
    labels = ids.clone()
    labels[:, : args.seq // 2] = -100

    def step() -> torch.Tensor:
        with torch.autocast(dev, dtype=torch.bfloat16):
            loss = model(input_ids=ids, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss

    if dev == "cuda":
        torch.cuda.reset_peak_memory_stats()
    step().item()
    started = time.perf_counter()
    for _ in range(args.steps):
        loss = step()
    loss.item()
    step_s = (time.perf_counter() - started) / args.steps
    return {"torch": torch.__version__, "step_s": step_s, "tokens_per_s": args.rows * args.seq / step_s,
            "peak_bytes": torch.cuda.max_memory_allocated() if dev == "cuda" else None}


def child(side: str, shape: str, args: argparse.Namespace) -> dict:
    """One side at one shape in a fresh process; {"error": ...} if it failed (e.g. out of memory)."""
    passed = _forward(args)
    env = {**os.environ, "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
    run = subprocess.run([sys.executable, __file__, "--child", side, "--shape", shape, *passed],
                         capture_output=True, text=True, env=env)
    if run.returncode != 0:
        return {"error": run.stderr.strip().splitlines()[-1] if run.stderr.strip() else f"exit {run.returncode}"}
    return json.loads(run.stdout.strip().splitlines()[-1])


def _forward(args: argparse.Namespace) -> list[str]:
    """The size options of `args` as command-line arguments for a child."""
    out = ["--kinds", *args.kinds, "--rows", str(args.rows), "--seq", str(args.seq), "--steps", str(args.steps),
           "--attention", args.attention]
    for flag, value in (("--layers", args.layers), ("--remat", args.remat), ("--chunk-tokens", args.chunk_tokens)):
        if value is not None:
            out += [flag, str(value)]
    return out


def measure(args: argparse.Namespace) -> dict:
    results = {"sizes": {"rows": args.rows, "seq": args.seq, "layers": args.layers, "steps": args.steps},
               "shapes": {}}
    for shape in args.shapes:
        results["shapes"][shape] = {"jax": child("jax", shape, args),
                                    "torch": None if args.no_torch else child("torch", shape, args)}
    return results


def rows(results: dict) -> list[tuple[str, float | None, float | None, str]]:
    """(measure, tandem, baseline, unit) rows for launch/bench.py's table."""
    out = []
    size = results["sizes"]
    for shape, sides in results["shapes"].items():
        jax_side, torch_side = sides["jax"], sides["torch"] or {}
        name = f"learner: Qwen2.5-{shape.upper()} shape, {size['rows']}x{size['seq']}"
        if "error" in jax_side:
            out.append((f"{name}: failed ({jax_side['error'][:80]})", None, None, ""))
            continue
        torch_tps = torch_side.get("tokens_per_s")
        for kind, row in jax_side["kinds"].items():
            versus = "transformers SFT step" if kind == "rl" else "transformers"
            # the transformers step's MFU by the same FLOPs count: tandem's MFU × its tok/s ratio
            scale = torch_tps / row["tokens_per_s"] if torch_tps else None
            out += [(f"{name}, {kind}: tok/s, tandem vs {versus}", row["tokens_per_s"], torch_tps, "tok/s")]
            out += [(f"{name}, {kind}: MFU against the {what}, tandem vs {versus}", row[key],
                     row[key] * scale if scale and row[key] is not None else None, "frac")
                    for key, what in (("mfu_spec", "bf16 spec"), ("mfu_measured", "measured matmul ceiling"))]
            out.append((f"{name}, {kind}: peak memory vs analytic floor",
                        (row["peak_bytes"] or row["xla_bytes"]) / GIB, row["floor_bytes"] / GIB, "GiB"))
        out.append((f"{name}: bf16 matmul ceiling measured vs spec", jax_side["matmul_tflops"],
                    jax_side["spec_tflops"], "TFLOP/s"))
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        print(json.dumps((jax_side if args.child == "jax" else torch_side)(args), default=float))
        return 0
    from launch.bench import format_table

    results = measure(args)
    print(format_table(rows(results)))
    write_report(args.json, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A learner's first minutes at a real model shape: process start to the 5th step, every compile, the remat and
micro-batches `train.remat: auto` chose, peak memory against the floor and MFU, per batch shape. Needs neither
vLLM nor Ray; runs on CPU (smoke: `--layers 2 --shapes 2x256`) and on a TPU/GPU as is.

    .venv/bin/python tests/benchmarks/bench_first_steps.py [--shape 0.5b] [--layers N] [--kind rl]
        [--shapes 8x1024 4x4096 1x32768] [--steps 5] [--remat auto] [--micro-batches 1] [--cold-and-warm]
        [--json out.json]

Where the start goes (`startup`, seconds from process start): imports, the backend up (`jax.devices()`), the
model built (random weights of the shape), the trainer built (layers stacked, state on the mesh).
Per shape (rows x tokens; the first is the one timed from process start), after the trainer is built:
  ready_s         process start to the end of the `--steps`-th step of the first shape (imports, model,
                  compile or cache load, steps)
  compiles        XLA compilations (cache misses) and persistent-cache loads of this process, with seconds
                  (learner.compile_log); `step_compiles_after_first` must be 0
  plan            the remat policy and micro-batches of that shape's step (learner.algo.step_plan)
  first_s         the first step's seconds with its compile or cache load; ahead_s of them the ahead-of-time
                  part (trace, lower, compile or load: Trainer.compile_rl_step), RL only
  step_s          every step's seconds; steady = the median after the first two
  peak            the device's peak bytes in use (accelerators; on CPU XLA's account of the compiled step;
                  on a TPU v5e it stays near the state's size, as if the step's temporaries were not counted),
                  beside XLA's account of the step (what `remat: auto` judged) and
                  the floor, bench_real_shape.floor_bytes (master weights, grads, AdamW, bf16 copy, layer inputs,
                  one logits chunk)
  MFU             of the device's bf16 spec (launch/device_check.PEAK_TFLOPS), two counts: the project's
                  (6·N + 12·L·d·T per token: causal attention counted in full, launch/device_check) and MaxText's
                  (causal attention counted half: 6·N + 6·L·d·T)
`--cold-and-warm` runs the whole benchmark twice in fresh processes sharing a fresh compilation cache: the
first compiles everything (cold), the second loads it (warm, as a restarted learner or a second run does).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

PROCESS_START = psutil.Process().create_time()  # wall clock (time.time) when this process started
ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "benchmarks")]

from launch.json_files import write_report  # noqa: E402

GIB = 2**30


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="0.5b", choices=("0.5b", "1.5b"))
    parser.add_argument("--layers", type=int, help="fewer layers than the shape's (smoke runs)")
    parser.add_argument("--kind", default="rl", choices=("rl", "sft"))
    parser.add_argument("--shapes", nargs="+", default=["8x1024", "4x4096", "1x32768"], help="rows x tokens")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--remat", default="auto", help="train.remat")
    parser.add_argument("--micro-batches", type=int, default=1, help="train.micro_batches (more if it does not fit)")
    parser.add_argument("--unrolled", action="store_true", help="train.scan_layers=false")
    parser.add_argument("--cold-and-warm", action="store_true", help="two fresh processes, one fresh cache")
    parser.add_argument("--json", type=Path)
    return parser.parse_args(argv)


def mfu(config: dict, seq: int, tokens_per_s: float, peak_tflops: float | None) -> dict[str, float | None]:
    """MFU by the project's count and by MaxText's (causal attention half of the full T², as it counts)."""
    from launch.device_check import flops_per_token

    full = flops_per_token(config, seq)
    heads, layers = config["num_attention_heads"], config["num_hidden_layers"]
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    half = full - 6 * layers * heads * head_dim * seq
    if not peak_tflops:
        return {"mfu_project": None, "mfu_maxtext": None}
    return {"mfu_project": full * tokens_per_s / 1e12 / peak_tflops,
            "mfu_maxtext": half * tokens_per_s / 1e12 / peak_tflops}


def run(args: argparse.Namespace) -> dict:
    from launch.run import use_compilation_cache

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("learner").setLevel(logging.DEBUG)  # every compile, its seconds, each plan and its bytes
    use_compilation_cache()
    import jax
    from bench_learner import batches, hf_config
    from bench_real_shape import floor_bytes
    from flax import nnx

    from launch.device_check import PEAK_TFLOPS
    from learner.algo.optim import OptimizerConfig
    from learner.algo.train_step import Trainer
    from learner.compile_log import CompileLog, summarize
    from models.jax_model import LoadedModel, make_mesh
    from models.tunix_families import MODEL_CLASSES, tunix_config

    log = CompileLog.install()
    startup = {"imports": time.time() - PROCESS_START}
    mesh = make_mesh(1, 1)
    startup["backend"] = time.time() - PROCESS_START
    config = hf_config(args.shape, args.layers)
    model = MODEL_CLASSES["qwen2"](tunix_config(config), rngs=nnx.Rngs(0))
    startup["model"] = time.time() - PROCESS_START
    trainer = Trainer(LoadedModel(model, "qwen2", config, tunix_config(config)), mesh,
                      OptimizerConfig(learning_rate=1e-6, schedule="constant"), compute_dtype="bfloat16",
                      remat=args.remat, micro_batches=args.micro_batches, skip_no_signal=False,
                      scan_layers=not args.unrolled)
    startup["trainer"] = time.time() - PROCESS_START
    device = jax.devices()[0]
    peak_tflops = PEAK_TFLOPS.get(device.device_kind)
    n_params = sum(int(x.size) for x in jax.tree.leaves(trainer.state.params))
    out = {"device": device.device_kind, "jax": jax.__version__, "params": n_params, "layers":
           config["num_hidden_layers"], "remat": args.remat, "scan_layers": not args.unrolled,
           "cache_dir": jax.config.jax_compilation_cache_dir, "startup": startup, "shapes": {}}
    for index, shape in enumerate(args.shapes):
        rows, seq = (int(x) for x in shape.split("x"))
        batch = batches(rows, seq)[args.kind]
        step = trainer.rl_step if args.kind == "rl" else trainer.sft_step
        mark = log.mark()
        if hasattr(device, "reset_peak_memory_stats"):
            device.reset_peak_memory_stats()
        started = time.perf_counter()
        if args.kind == "rl":
            plan = trainer.compile_rl_step(rows, seq)  # what the RL loop does while the actors sample
        ahead_s = time.perf_counter() - started
        times, after_first = [], 0
        try:
            for i in range(args.steps):
                step_mark, step_started = log.mark(), time.perf_counter()
                step(batch)
                jax.block_until_ready(trainer.state)
                times.append(time.perf_counter() - step_started)
                after_first += sum(r.is_step for r in log.since(step_mark)) if i else 0
        except Exception as error:  # noqa: BLE001  (an out-of-memory shape is a result, not the end)
            out["shapes"][shape] = {"error": repr(error)[:600]}
            print(json.dumps({shape: out["shapes"][shape]}), file=sys.stderr, flush=True)
            continue
        plan = trainer.plans[("rl" if args.kind == "rl" else "ce", rows, seq)]
        steady = statistics.median(times[2:] or times)
        stats = device.memory_stats() or {}
        result = {
            "plan": {"remat": plan.remat, "micro_batches": plan.parts, "xla_gib": plan.device_bytes / GIB},
            "first_s": time.perf_counter() - started - sum(times[1:]), "ahead_s": ahead_s, "step_s": times,
            "steady_s": steady,
            "tokens_per_s": rows * seq / steady, **mfu(config, seq, rows * seq / steady, peak_tflops),
            "peak_gib": stats.get("peak_bytes_in_use", plan.device_bytes) / GIB,
            "floor_gib": floor_bytes(n_params, "mixed", layers=config["num_hidden_layers"], tokens=rows * seq,
                                     hidden=config["hidden_size"], vocab=config["vocab_size"],
                                     chunk_tokens=trainer.chunk_tokens) / GIB,
            "compiles": summarize(log.since(mark)), "step_compiles_after_first": after_first}
        if index == 0:
            result["ready_s"] = time.time() - PROCESS_START
        out["shapes"][shape] = result
        print(json.dumps({shape: result}), file=sys.stderr, flush=True)
    out["compiles"] = summarize(log.since())
    return out


def cold_and_warm(args: argparse.Namespace, argv: list[str]) -> dict:
    """The benchmark twice in fresh processes over one fresh compilation cache."""
    child_argv = [a for a in argv if a != "--cold-and-warm"]
    child_argv = [a for i, a in enumerate(child_argv) if a != "--json" and (i == 0 or child_argv[i - 1] != "--json")]
    results = {}
    with tempfile.TemporaryDirectory(prefix="tandem-bench-cache-") as cache:
        env = {**os.environ, "JAX_COMPILATION_CACHE_DIR": cache}
        for name in ("cold", "warm"):
            with tempfile.NamedTemporaryFile(suffix=".json") as out:
                subprocess.run([sys.executable, __file__, *child_argv, "--json", out.name], env=env, check=True)
                results[name] = json.loads(Path(out.name).read_text())
    return results


def table(result: dict) -> str:
    lines = [f"{result['device']}, {result['params'] / 1e6:.0f}M params, {result['layers']} layers "
             f"({'scanned' if result['scan_layers'] else 'unrolled'}), remat {result['remat']}; from process start: "
             + ", ".join(f"{name} {s:.1f} s" for name, s in result["startup"].items()),
             "| shape | plan | first step s (ahead) | steady s | tok/s | MFU project / MaxText | "
             "peak / XLA's / floor GiB | compiles (s) | cache loads | compiles after step 1 | ready s |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for shape, r in result["shapes"].items():
        if "error" in r:
            lines.append(f"| {shape} | error: {r['error'][:120]} |")
            continue
        mfus = " / ".join("-" if r[k] is None else f"{r[k]:.1%}" for k in ("mfu_project", "mfu_maxtext"))
        c = r["compiles"]
        lines.append(f"| {shape} | {r['plan']['remat']} × {r['plan']['micro_batches']} | {r['first_s']:.1f} "
                     f"({r['ahead_s']:.1f}) | "
                     f"{r['steady_s']:.3f} | {r['tokens_per_s']:,.0f} | {mfus} | {r['peak_gib']:.2f} / "
                     f"{r['plan']['xla_gib']:.2f} / {r['floor_gib']:.2f} | "
                     f"{c['compiles']:.0f} ({c['compile_s']:.1f}) | {c['cache_loads']:.0f} | "
                     f"{r['step_compiles_after_first']} | {r.get('ready_s', float('nan')):.1f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    results = cold_and_warm(args, argv) if args.cold_and_warm else {"run": run(args)}
    for name, result in results.items():
        print(f"\n## {name}\n{table(result)}")
    write_report(args.json, results if args.cold_and_warm else results["run"])
    return 0


if __name__ == "__main__":
    sys.exit(main())

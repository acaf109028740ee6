"""Compile time of the learner's rl step against depth, layers under a scan vs unrolled: the ahead-of-time
compile (Trainer.compile_rl_step) in a fresh process each, no compilation cache.

    .venv/bin/python tests/benchmarks/bench_compile.py [--widths small|0.5b] [--layers 4 16] [--rows 8] [--seq 256]

small: d=256, MLP 512, 4 heads x 64, 2 KV heads, vocab 512 (what the CPU criterion is stated at); 0.5b:
Qwen2.5-0.5B's widths and vocabulary. Prints seconds per (layers, scan) and, per mode, the ratio of the
deepest to the shallowest: a scanned step compiles one layer whatever the depth.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "benchmarks")]
SMALL = dict(vocab_size=512, hidden_size=256, intermediate_size=512, num_heads=4, num_kv_heads=2, head_dim=64)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--widths", default="small", choices=("small", "0.5b"))
    parser.add_argument("--layers", type=int, nargs="+", default=[4, 16])
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--remat", default="save_matmuls", help="a fixed policy: one compile per measurement")
    parser.add_argument("--modes", nargs="+", default=["scan", "unrolled"], choices=("scan", "unrolled"))
    parser.add_argument("--child", nargs=2, metavar=("LAYERS", "SCAN"), help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def compile_seconds(args: argparse.Namespace, layers: int, scan: bool) -> float:
    import jax
    from flax import nnx

    from learner.algo.optim import OptimizerConfig
    from learner.algo.train_step import Trainer
    from models.jax_model import LoadedModel, make_mesh
    from models.tiny import QWEN2_5_0_5B, tiny_hf_config
    from models.tunix_families import MODEL_CLASSES, tunix_config

    dims = {**SMALL, "tie_word_embeddings": False, "max_position_embeddings": 4096} if args.widths == "small" \
        else QWEN2_5_0_5B
    config = tiny_hf_config(family="qwen2", **{**dims, "num_layers": layers}, special_ids=(0, 1, 0))
    mesh = make_mesh(1, 1)
    model = MODEL_CLASSES["qwen2"](tunix_config(config), rngs=nnx.Rngs(0))
    trainer = Trainer(LoadedModel(model, "qwen2", config, tunix_config(config)), mesh, OptimizerConfig(),
                      compute_dtype="bfloat16", remat=args.remat, scan_layers=scan)
    jax.block_until_ready(trainer.state)
    started = time.perf_counter()
    trainer.compile_rl_step(args.rows, args.seq)
    return time.perf_counter() - started


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args.child:
        print("RESULT", json.dumps(compile_seconds(args, int(args.child[0]), args.child[1] == "scan")))
        return 0
    env = {**os.environ, "JAX_ENABLE_COMPILATION_CACHE": "false"}
    seconds: dict[tuple[int, bool], float] = {}
    modes = [mode == "scan" for mode in args.modes]
    for scan in modes:
        for layers in args.layers:
            out = subprocess.run([sys.executable, __file__, *argv, "--child", str(layers),
                                  "scan" if scan else "unrolled"], env=env, capture_output=True, text=True, check=True)
            seconds[layers, scan] = json.loads(out.stdout.split("RESULT", 1)[1])
            print(f"{layers:3d} layers {'scanned ' if scan else 'unrolled'}: {seconds[layers, scan]:6.1f} s",
                  flush=True)
    low, high = min(args.layers), max(args.layers)
    for scan in modes:
        print(f"{'scanned ' if scan else 'unrolled'}: {high}/{low} layers = "
              f"{seconds[high, scan] / seconds[low, scan]:.2f}x")
    if len(modes) == 2:
        print(f"scanned / unrolled at {high} layers: {seconds[high, True] / seconds[high, False]:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())

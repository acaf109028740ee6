"""The learner at a real model's shape: memory per step against the analytic floor, and step speed,
float32 vs mixed precision (issue 27), and LoRA against full fine-tuning (issue 39). Qwen2.5-0.5B's widths,
heads and 151,936-token vocabulary, random weights (models.tiny.make_chatml_model), an SFT step of the shipped
config's kind.

    .venv/bin/python tests/benchmarks/bench_real_shape.py [--layers 24] [--rows 8] [--seq 256]
        [--speed-layers 2] [--steps 3] [--lora-rank 8] [--json out.json]

memory  XLA's own account of the compiled step (memory_analysis: arguments + temporaries, the
        donated state counted once), for float32, mixed precision and mixed with LoRA of `--lora-rank` on
        all seven projections (the base frozen in bf16, the adapters' master and AdamW in float32), each
        under every train.remat policy (none, full, save_matmuls), at `--layers` layers (compiled, not run:
        the full 24 layers fit no 2-core budget of time); and the bytes of the train state (master weights
        + AdamW's moments) and of the frozen base. Beside it the analytic floor: trainable master weights +
        gradients + AdamW's two moments (+ the bf16 copy the step runs on) + the frozen base (LoRA) + the
        activations a remat step must keep (each layer's input, in the compute dtype) + one logits
        chunk (train.logits_chunk_tokens × V fp32). The ratio says how far the step is from what it cannot do without.
speed   tokens/s of `--steps` timed SFT steps (after one compile step) at `--speed-layers` layers,
        float32 vs mixed vs mixed with LoRA (bf16 compute is ~2× slower than float32 on CPUs without bf16
        units; the row is for accelerators).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from launch.json_files import write_report  # noqa: E402

PRECISIONS = {"float32": ("float32", None), "mixed": ("float32", "bfloat16")}
LORA_PRECISION = "mixed"  # the LoRA rows': the base frozen in bf16, the adapters' master float32
REMAT_POLICIES = ("none", "full", "save_matmuls")  # learner.schema.RematPolicy
BYTES = {"float32": 4, "bfloat16": 2}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=24, help="decoder layers of the memory rows")
    parser.add_argument("--speed-layers", type=int, default=2, help="decoder layers of the speed rows")
    parser.add_argument("--rows", type=int, default=8, help="packed rows per step")
    parser.add_argument("--seq", type=int, default=256, help="tokens per row")
    parser.add_argument("--chunk-tokens", type=int, default=2048, help="train.logits_chunk_tokens")
    parser.add_argument("--steps", type=int, default=3, help="timed steps of the speed rows")
    parser.add_argument("--lora-rank", type=int, default=8, help="rank of the LoRA rows (0: none)")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--child", nargs=4, metavar=("MODEL_DIR", "PRECISION", "REMAT", "LORA_RANK"),
                        help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def sft_batch(rows: int, seq: int, vocab: int, seed: int = 0):
    """One packed SFT batch: every row a single example, loss on its second half."""
    import numpy as np

    from learner.data import TokenBatch

    ids = np.random.default_rng(seed).integers(0, 256, (rows, seq)).astype(np.int32)
    loss = np.zeros((rows, seq), np.float32)
    loss[:, seq // 2:] = 1
    positions = np.broadcast_to(np.arange(seq, dtype=np.int32), (rows, seq)).copy()
    ones = np.ones((rows, seq), np.int32)
    return TokenBatch(ids, ones, loss, ones.copy(), positions)


def trainer_for(model_dir: Path, precision: str, *, remat: str, chunk_tokens: int, lora_rank: int = 0):
    """A Trainer of `precision`; with `lora_rank`, LoRA on all seven projections (launch/trainer.py's way: the
    base loaded in the compute dtype, the adapters in the master dtype)."""
    import jax

    from learner.algo.optim import OptimizerConfig
    from learner.algo.train_step import Trainer
    from models.jax_model import load_model, make_mesh
    from models.lora import apply_lora
    from models.peft import LoraConfig

    param_dtype, compute_dtype = PRECISIONS[precision]
    mesh = make_mesh(1, 1)
    loaded = load_model(model_dir, mesh=mesh, dtype=compute_dtype if lora_rank else param_dtype)
    if lora_rank:
        with jax.set_mesh(mesh):
            loaded = apply_lora(loaded, LoraConfig(rank=lora_rank, alpha=2.0 * lora_rank), dtype=param_dtype)
    return Trainer(loaded, mesh, OptimizerConfig(learning_rate=1e-6, schedule="constant"), compute_dtype=compute_dtype,
                   remat=remat, chunk_tokens=chunk_tokens)


def floor_bytes(n_params: int, precision: str, *, layers: int, tokens: int, hidden: int, vocab: int,
                chunk_tokens: int, frozen_params: int = 0) -> int:
    """master + grads + AdamW m, v (+ compute copy) of the `n_params` trained, the `frozen_params` in the
    compute dtype (LoRA's base), per-layer inputs, one fp32 logits chunk."""
    param_dtype, compute_dtype = PRECISIONS[precision]
    master = n_params * BYTES[param_dtype]
    compute = BYTES[compute_dtype or param_dtype]
    copy = n_params * compute if compute_dtype else 0
    return (4 * master + copy + frozen_params * compute + layers * tokens * hidden * compute
            + min(tokens, chunk_tokens) * vocab * 4)


def tree_bytes(tree) -> int:
    import jax

    return sum(x.nbytes for x in jax.tree.leaves(tree))


def compiled_memory(trainer, kind: str, arrays: dict):
    """XLA's memory analysis of the trainer's compiled `kind` step ("sft" or "rl") on host `arrays`
    (compiled, not run)."""
    return trainer.compiled_memory("rl" if kind == "rl" else "ce", arrays)


def step_memory(model_dir: Path, precision: str, remat: str, lora_rank: int, args: argparse.Namespace) -> dict:
    """XLA's bytes of one compiled SFT step of `precision` (with LoRA of `lora_rank` unless 0), and the train
    state's (run in a child process: a 24-layer state is ~6-9 GiB, and a process does not hand it back to
    the next configuration)."""
    import jax
    import numpy as np
    from flax import nnx

    from models.tiny import QWEN2_5_0_5B

    batch = sft_batch(args.rows, args.seq, QWEN2_5_0_5B["vocab_size"])
    trainer = trainer_for(model_dir, precision, remat=remat, chunk_tokens=args.chunk_tokens, lora_rank=lora_rank)
    n_params = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(trainer.state.params))
    # LoRA's frozen base, which the step reads beside the state (nothing without LoRA)
    frozen = nnx.state(trainer.loaded.model, nnx.All(nnx.Param, nnx.Not(nnx.LoRAParam))) if trainer.lora else ()
    started = time.perf_counter()
    analysis = compiled_memory(trainer, "sft", batch._asdict())
    floor = floor_bytes(n_params, precision, layers=args.layers, tokens=args.rows * args.seq,
                        hidden=QWEN2_5_0_5B["hidden_size"], vocab=QWEN2_5_0_5B["vocab_size"],
                        chunk_tokens=args.chunk_tokens,
                        frozen_params=sum(int(np.prod(x.shape)) for x in jax.tree.leaves(frozen)))
    return {"params": n_params, "argument_bytes": analysis.argument_size_in_bytes,
            "temp_bytes": analysis.temp_size_in_bytes,
            "step_bytes": analysis.argument_size_in_bytes + analysis.temp_size_in_bytes,
            "state_bytes": tree_bytes((trainer.state.params, trainer.state.opt_state)),
            "frozen_bytes": tree_bytes(frozen), "floor_bytes": floor, "compile_s": time.perf_counter() - started}


def configurations(lora_rank: int) -> list[tuple[str, str, int]]:
    """(row name, precision, LoRA rank) of the rows: each precision, then mixed with LoRA."""
    rows = [(precision, precision, 0) for precision in PRECISIONS]
    return rows + ([(f"{LORA_PRECISION}, LoRA r{lora_rank}", LORA_PRECISION, lora_rank)] if lora_rank else [])


def memory_rows(args: argparse.Namespace, tmp: Path) -> dict:
    from models.tiny import make_chatml_model

    model_dir = make_chatml_model(tmp / f"qwen-{args.layers}", num_layers=args.layers, dtype="bfloat16")
    out = {}
    for name, precision, lora_rank in configurations(args.lora_rank):
        for remat in REMAT_POLICIES:
            child = subprocess.run(
                [sys.executable, __file__, "--child", str(model_dir), precision, str(remat), str(lora_rank),
                 *(f"--{k.replace('_', '-')}={v}" for k, v in vars(args).items()
                   if k in ("layers", "rows", "seq", "chunk_tokens"))],
                capture_output=True, text=True, check=True)
            row = json.loads(child.stdout.strip().splitlines()[-1])
            out[f"{name}, remat {remat}"] = row
            print(f"[real shape] memory {name} remat={remat}: {row['step_bytes'] / 2**30:.2f} GiB "
                  f"(floor {row['floor_bytes'] / 2**30:.2f})", file=sys.stderr, flush=True)
    return out


def speed_rows(args: argparse.Namespace, tmp: Path) -> dict:
    from models.tiny import QWEN2_5_0_5B, make_chatml_model

    model_dir = make_chatml_model(tmp / f"qwen-{args.speed_layers}", num_layers=args.speed_layers,
                                  dtype="bfloat16")
    batch = sft_batch(args.rows, args.seq, QWEN2_5_0_5B["vocab_size"])
    out = {}
    for name, precision, lora_rank in configurations(args.lora_rank):
        trainer = trainer_for(model_dir, precision, remat="none", chunk_tokens=args.chunk_tokens, lora_rank=lora_rank)
        trainer.sft_step(batch)  # compiles
        started = time.perf_counter()
        for _ in range(args.steps):
            trainer.sft_step(batch)
        seconds = (time.perf_counter() - started) / args.steps
        out[name] = {"step_s": seconds, "tokens_per_s": batch.attention_mask.sum() / seconds}
        print(f"[real shape] speed {name}: {seconds:.2f} s/step", file=sys.stderr, flush=True)
        del trainer
    return out


def measure(args: argparse.Namespace) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        return {"memory": memory_rows(args, Path(tmp)), "speed": speed_rows(args, Path(tmp)),
                "sizes": {k: str(v) for k, v in vars(args).items()}}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        model_dir, precision, remat, lora_rank = args.child
        print(json.dumps(step_memory(Path(model_dir), precision, remat, int(lora_rank), args)))
        return 0
    results = measure(args)
    for name, row in results["memory"].items():
        print(f"step memory {name:<34} {row['step_bytes'] / 2**30:7.2f} GiB  floor {row['floor_bytes'] / 2**30:6.2f} "
              f"GiB  {row['step_bytes'] / row['floor_bytes']:.2f}x  train state {row['state_bytes'] / 2**30:6.3f} GiB"
              f"  frozen base {row['frozen_bytes'] / 2**30:6.3f} GiB")
    print("step tokens/s " + ", ".join(f"{name} {row['tokens_per_s']:.0f}" for name, row in results["speed"].items()))
    write_report(args.json, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())

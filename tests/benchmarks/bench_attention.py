"""Attention implementations side by side (models.attention): forward + backward time and error against
the einsum reference, causal with packed segments, bf16, GQA at Qwen2.5-0.5B's heads (14 query heads,
2 KV heads, head_dim 64). On an accelerator this checks the fused kernel itself (not its CPU interpreter).

    .venv/bin/python tests/benchmarks/bench_attention.py [--lengths 1024 4096 16384] [--impls ...]
        [--repeats 5] [--json out.json]

Each row: one row of `--lengths` tokens holding four packed sequences and right padding; the time of
jit(grad(sum(attention · w))) (median of `--repeats`), and the max |Δ| of the output and of dq against
the einsum reference in float32 (computed only up to `--reference-max` tokens: its scores grow with T²).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from launch.json_files import write_report  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 4096, 16384])
    parser.add_argument("--impls", nargs="+", help="default: xla, blockwise and the backend's kernel")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--reference-max", type=int, default=8192)
    parser.add_argument("--json", type=Path)
    return parser.parse_args(argv)


def inputs(length: int):
    import jax
    import jax.numpy as jnp

    keys = jax.random.split(jax.random.key(0), 4)
    q = jax.random.normal(keys[0], (1, length, 14, 64), jnp.bfloat16)
    k, v = (jax.random.normal(key, (1, length, 2, 64), jnp.bfloat16) for key in keys[1:3])
    w = jax.random.normal(keys[3], (1, length, 14, 64), jnp.float32)
    quarter = length // 4
    seg = jnp.minimum(jnp.arange(length) // quarter + 1, 4)
    seg = jnp.where(jnp.arange(length) < length - quarter // 2, seg, 0)[None].astype(jnp.int32)  # padding
    return q, k, v, seg, w


def measure(args: argparse.Namespace) -> dict:
    import jax
    import jax.numpy as jnp

    from models.attention import attention, resolve

    impls = args.impls or ["xla", "blockwise", *{resolve("auto")} - {"blockwise"}]
    results = {"backend": jax.default_backend(), "device": jax.devices()[0].device_kind, "rows": []}

    def loss(q, k, v, seg, w, impl):
        return jnp.sum(attention(q, k, v, seg, impl=impl).astype(jnp.float32) * w)

    step = jax.jit(jax.value_and_grad(loss), static_argnames="impl")
    for length in args.lengths:
        q, k, v, seg, w = inputs(length)
        reference = None
        if length <= args.reference_max:
            as_f32 = [x.astype(jnp.float32) for x in (q, k, v)]
            reference = step(*as_f32, seg, w, impl="xla")
        for impl in impls:
            if impl == "xla" and length > args.reference_max:
                continue
            try:
                value, grad = jax.block_until_ready(step(q, k, v, seg, w, impl=impl))
            except Exception as error:  # a kernel that fails to compile on this device: say so, go on
                results["rows"].append({"impl": impl, "length": length, "error": repr(error)[:300]})
                continue
            times = []
            for _ in range(args.repeats):
                started = time.perf_counter()
                jax.block_until_ready(step(q, k, v, seg, w, impl=impl))
                times.append(time.perf_counter() - started)
            row = {"impl": impl, "length": length, "fwd_bwd_ms": 1e3 * statistics.median(times)}
            if reference is not None:
                row["dq_max_err"] = float(jnp.abs(grad.astype(jnp.float32) - reference[1]).max())
                row["loss_rel_err"] = float(abs(value - reference[0]) / abs(reference[0]))
            results["rows"].append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
    return results


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    results = measure(args)
    print(f"{results['device']} ({results['backend']})")
    for row in results["rows"]:
        if "error" in row:
            print(f"{row['impl']:<11} T={row['length']:<6} failed: {row['error']}")
            continue
        errors = ""
        if "dq_max_err" in row:
            errors = f"dq max err {row['dq_max_err']:.2e}, loss rel err {row['loss_rel_err']:.1e}"
        print(f"{row['impl']:<11} T={row['length']:<6} fwd+bwd {row['fwd_bwd_ms']:9.2f} ms   {errors}")
    write_report(args.json, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())

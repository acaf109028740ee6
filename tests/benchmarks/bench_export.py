"""Export throughput: `export_hf_tensors` vs a plain `jax.device_get` of the same params (the floor).

    python tests/benchmarks/bench_export.py [--fsdp N] [--repeats R]

Builds a ~100M-param Qwen2-shaped HF dir, loads it in float32 and in bfloat16, and times draining
`export_hf_tensors` (device -> host, HF names, HF layout) against `jax.device_get` of the param
tree (fresh device copies each run: a jax.Array caches its host value after the first fetch).
On a CPU backend `device_get` can be zero-copy (views of the device buffers), so a second floor is
printed: device_get plus one host copy of every array (what any export must at least do).
Ratios are export time over floor time.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

MODEL = dict(family="qwen2", num_layers=7, hidden_size=1024, intermediate_size=4096, num_heads=16,
             num_kv_heads=4, head_dim=64)


def best_of(repeats: int, fn, setup=lambda: None) -> float:
    """Fastest wall time of `repeats` runs of fn(setup()) (the least disturbed by other load)."""
    times = []
    for _ in range(repeats):
        arg = setup()
        start = time.perf_counter()
        fn(arg)
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--fsdp", type=int, default=1, help="shard params over this many (CPU) devices")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    if args.fsdp > 1:
        os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={args.fsdp}"
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

    import jax
    import jax.numpy as jnp
    import numpy as np
    from flax import nnx

    from models.jax_model import export_hf_tensors, load_model, make_mesh
    from models.tiny import make_tiny_model

    mesh = make_mesh(fsdp=args.fsdp) if args.fsdp > 1 else None
    with tempfile.TemporaryDirectory() as tmp:
        hf_dir = make_tiny_model(Path(tmp) / "model", **MODEL)
        print(f"backend={jax.default_backend()} devices={args.fsdp} best of {args.repeats}; MB/s")
        print(f"{'dtype':>9} {'params':>8} {'MB':>6} {'export':>8} {'device_get':>11} {'ratio':>6} "
              f"{'get+copy':>9} {'ratio':>6}")
        for dtype in ("float32", "bfloat16"):
            loaded = load_model(hf_dir, mesh=mesh, dtype=dtype)
            params = nnx.state(loaded.model, nnx.Param)
            leaves = jax.tree.leaves(params)
            n_params = sum(x.size for x in leaves)
            megabytes = sum(x.nbytes for x in leaves) / 1e6

            def fresh(ls=leaves):
                return jax.block_until_ready([jnp.copy(x) for x in ls])

            def drain(_, lm=loaded):
                return [a for _, a in export_hf_tensors(lm)]

            def get_copy(ls):
                return [np.array(x, copy=True) for x in jax.device_get(ls)]

            for fn in (drain, jax.device_get, get_copy):  # warm-up: compiles, first-touch allocations
                fn(fresh())
            export = best_of(args.repeats, drain)
            floor = best_of(args.repeats, jax.device_get, fresh)
            floor_copy = best_of(args.repeats, get_copy, fresh)
            print(f"{dtype:>9} {n_params / 1e6:>7.1f}M {megabytes:>6.0f} {megabytes / export:>8.0f} "
                  f"{megabytes / floor:>11.0f} {export / floor:>6.1f} {megabytes / floor_copy:>9.0f} "
                  f"{export / floor_copy:>6.2f}")
            del loaded, params, leaves


if __name__ == "__main__":
    main()

"""What each train.remat policy keeps for the backward pass, per token and decoder layer, at real widths,
and what that makes of a batch (issue 38).

    .venv/bin/python tests/benchmarks/bench_remat.py [--shapes 0.5b 1.5b] [--tokens 65536] [--json out.json]

JAX's own account of the residuals a gradient saves (jax.ad_checkpoint's saved residuals: the same on
every backend; XLA's CPU memory analysis cannot show remat, it reports the same bytes under every
policy), bf16 compute: the residuals of a 2-layer model minus those of a 1-layer one are one layer's.
The batch estimate is activations only: layers × tokens × per-token bytes (the default `--tokens` is
the shipped qwen config's micro-batch, 64 rows × 1024).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "benchmarks")]

from launch.json_files import write_report  # noqa: E402

LENGTH = 512  # tokens of the probe (per-token bytes do not depend on it: attention is blockwise)


def layer_bytes_per_token(shape: str, policy: str) -> float:
    """Bytes per token that one decoder layer leaves for the backward pass under `policy`."""
    import jax.numpy as jnp
    from bench_learner import hf_config
    from flax import nnx
    from jax._src.ad_checkpoint import saved_residuals  # public API only prints them

    from learner.algo.train_step import cast_floating
    from models.tunix_families import MODEL_CLASSES, tunix_config

    def residual_bytes(layers: int) -> int:
        model = MODEL_CLASSES["qwen2"](tunix_config(hf_config(shape, layers)), rngs=nnx.Rngs(0))
        graphdef, params, rest = nnx.split(model, nnx.Param, ...)
        ids = jnp.ones((1, LENGTH), jnp.int32)
        positions, segments = jnp.arange(LENGTH)[None], jnp.ones((1, LENGTH), jnp.int32)

        def forward(p):
            m = nnx.merge(graphdef, cast_floating(p, jnp.bfloat16), rest)
            m.remat_policy = policy
            return m.hidden_states(ids, positions, segments).astype(jnp.float32).sum()

        saved = saved_residuals(forward, params)
        return sum(int(np.prod(a.shape)) * a.dtype.itemsize for a, _ in saved if a.shape[:2] == (1, LENGTH))

    return (residual_bytes(2) - residual_bytes(1)) / LENGTH


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="+", default=["0.5b", "1.5b"], choices=("0.5b", "1.5b"))
    parser.add_argument("--tokens", type=int, default=64 * 1024, help="tokens of one micro-batch")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    from bench_learner import hf_config

    from models.tunix_families import REMAT_POLICIES

    results = {}
    for shape in args.shapes:
        layers = hf_config(shape, None)["num_hidden_layers"]
        for policy in REMAT_POLICIES:
            per_token = layer_bytes_per_token(shape, policy)
            batch = per_token * layers * args.tokens
            results[f"{shape}, {policy}"] = {"bytes_per_token_per_layer": per_token, "batch_bytes": batch}
            print(f"Qwen2.5-{shape.upper()} remat {policy:<12} {per_token / 1024:6.1f} KiB per token per layer; "
                  f"{layers} layers x {args.tokens} tokens: {batch / 2**30:6.1f} GiB of activations")
    write_report(args.json, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())

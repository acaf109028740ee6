"""Logits precision at a real model's shape (issue 38): does unembedding in float32 (train.float32_logits)
bring the learner's bf16 logprobs closer to vLLM's behaviour logprobs?

    .venv/bin/python tests/benchmarks/bench_logits_precision.py [--layers 24] [--prompts 8] [--group 4]
        [--prompt-tokens 32] [--tokens 48] [--sharpen 6] [--json out.json]

Model: Qwen2.5-0.5B's widths and 151,936-token vocabulary, random weights, untied, the final norm's gain
set to `--sharpen` so the softmax is LM-like (entropy ~6 nats at 6; a random model's is ~11.9), saved in
bf16 (what the actors load). vLLM (bf16, processed logprobs, temperature 1) samples `--group`
completions of `--tokens` tokens for each of `--prompts` random prompts; the learner then computes the
same tokens' logprobs with the functions its train step uses (learner.algo.logprobs):
  float32          float32 weights, float32 compute (the reference)
  mixed            float32 master weights cast to bf16 (the default for bf16 models)
  mixed, f32 head  the same, with the float32 master head on the bf16 body's hidden states cast to float32
Printed per variant, over the completion tokens: token-mean |Δ| to the float32 logprobs and to vLLM's
(behaviour_gap, what the RL loop logs at its first step), their p99, and the mean entropy.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

from launch.json_files import write_report  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--group", type=int, default=4, help="completions per prompt")
    parser.add_argument("--prompt-tokens", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=48, help="completion tokens")
    parser.add_argument("--sharpen", type=float, default=6.0, help="the final norm's gain")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path)
    return parser.parse_args(argv)


def sharpened_model(out_dir: Path, layers: int, sharpen: float) -> Path:
    """A bf16 Qwen2.5-0.5B-shaped checkpoint, untied (a tied random model copies its input token), with
    the final norm's gain `sharpen`."""
    import ml_dtypes
    from safetensors.numpy import load_file, save_file

    from models.tiny import make_chatml_model

    make_chatml_model(out_dir, num_layers=layers, dtype="bfloat16", tie_word_embeddings=False)
    path = out_dir / "model.safetensors"
    tensors = load_file(path)
    tensors["model.norm.weight"] = np.full(tensors["model.norm.weight"].shape, sharpen, ml_dtypes.bfloat16)
    save_file(tensors, str(path), metadata={"format": "pt"})
    return out_dir


def sample(model_dir: Path, args: argparse.Namespace) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Rows prompt + completion (right-padded), their attention mask, the completion tokens' mask, and
    vLLM's logprob of each completion token at its position (0 elsewhere)."""
    from actors.engine import RolloutEngine, SamplingSpec

    rng = np.random.default_rng(args.seed)
    prompts = rng.integers(1000, 150_000, (args.prompts, args.prompt_tokens)).tolist()
    engine = RolloutEngine(model_dir, max_model_len=args.prompt_tokens + args.tokens + 8, kv_cache_gib=1,
                           seed=args.seed, dtype="bfloat16")
    groups = engine.generate(prompts, SamplingSpec(n=args.group, max_tokens=args.tokens))
    engine.shutdown()
    length = args.prompt_tokens + args.tokens
    rows = [(prompt, s) for prompt, group in zip(prompts, groups, strict=True) for s in group]
    ids, mask, completion = (np.zeros((len(rows), length), np.int32) for _ in range(3))
    behaviour = np.zeros((len(rows), length), np.float32)
    for r, (prompt, s) in enumerate(rows):
        tokens = prompt + s.token_ids
        ids[r, :len(tokens)], mask[r, :len(tokens)], completion[r, len(prompt):len(tokens)] = tokens, 1, 1
        behaviour[r, len(prompt):len(tokens)] = s.logprobs
    return ids, mask, completion.astype(bool), behaviour


def learner_logprobs(model_dir: Path, ids: np.ndarray, mask: np.ndarray) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """(logprob of token t given < t, entropy) [B, T] per variant, aligned with `ids` (column 0 is 0)."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from learner.algo.logprobs import per_token_logprobs
    from learner.algo.train_step import cast_floating
    from models.jax_model import load_model

    master = load_model(model_dir, dtype="float32").model
    graphdef, params, rest = nnx.split(master, nnx.Param, ...)

    @functools.partial(jax.jit, static_argnames=("compute", "float32_head"))
    def logprobs(params, ids, mask, *, compute: str, float32_head: bool):
        # every model built from traced params inside the jit, as the train step does (a model captured by a
        # closure is a constant, and jax caches traces by function)
        model = nnx.merge(graphdef, cast_floating(params, jnp.dtype(compute)), rest)
        head = nnx.merge(graphdef, params, rest) if float32_head else None
        return per_token_logprobs(model, ids, mask, chunk_tokens=2048, float32_head=head)

    variants = {"float32": ("float32", False), "mixed": ("bfloat16", False), "mixed, f32 head": ("bfloat16", True)}
    out = {}
    for name, (compute, float32_head) in variants.items():
        logps, entropy = logprobs(params, jnp.asarray(ids), jnp.asarray(mask), compute=compute,
                                  float32_head=float32_head)
        pad = lambda x: np.pad(np.asarray(x, np.float64), ((0, 0), (1, 0)))  # noqa: E731
        out[name] = (pad(logps), pad(entropy))
        print(f"[logits precision] {name} done", file=sys.stderr, flush=True)
    return out


def gaps(a: np.ndarray, b: np.ndarray, where: np.ndarray) -> dict[str, float]:
    diff = np.abs(a - b)[where]
    return {"mean": float(diff.mean()), "p99": float(np.quantile(diff, 0.99)), "max": float(diff.max())}


def measure(args: argparse.Namespace) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = sharpened_model(Path(tmp) / "model", args.layers, args.sharpen)
        ids, mask, completion, behaviour = sample(model_dir, args)
        variants = learner_logprobs(model_dir, ids, mask)
    reference = variants["float32"][0]
    rows = {name: {"to_float32": gaps(logps, reference, completion),
                   "behaviour_gap": gaps(logps, behaviour, completion), "entropy": float(entropy[completion].mean())}
            for name, (logps, entropy) in variants.items()}
    return {"variants": rows, "completion_tokens": int(completion.sum()), "sizes": vars(args) | {"json": None}}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    results = measure(args)
    print(f"{results['completion_tokens']} completion tokens, {args.layers} layers, final-norm gain {args.sharpen}")
    for name, row in results["variants"].items():
        f32, gap = row["to_float32"], row["behaviour_gap"]
        print(f"{name:<16} |Δ| to float32 {f32['mean']:.4f} (p99 {f32['p99']:.3f})   behaviour_gap "
              f"{gap['mean']:.4f} (p99 {gap['p99']:.3f})   entropy {row['entropy']:.2f}")
    write_report(args.json, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())

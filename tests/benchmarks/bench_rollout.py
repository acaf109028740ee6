"""Rollout throughput: tandem's vLLM RolloutEngine vs transformers ``generate`` on the same tiny model.

Same HF dir, prompts, G, temperature and max_tokens for both. Each backend runs in its own
subprocess (vLLM lowers torch's thread count for the whole process it lives in), one warm-up call,
then the best of ``--repeats`` timed calls. Prints generated tokens/s of each and the ratio.

    .venv/bin/python tests/benchmarks/bench_rollout.py [--prompts 32 --group-size 8 --max-tokens 64]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# The demo's model shape (0.6M params); head_dim 32 because vLLM's CPU attention needs >= 32.
MODEL = dict(num_layers=3, hidden_size=128, intermediate_size=384, num_heads=4, num_kv_heads=2, head_dim=32)


def make_prompts(num: int, seed: int) -> list[list[int]]:
    """Chat-shaped prompts `<bos><user>ddd+ddd<asst>` in token ids of models.tokenizer."""
    import random

    from models.tokenizer import ASST_ID, BOS_ID, DEFAULT_ALPHABET, SPECIAL_TOKENS, USER_ID

    rng = random.Random(seed)
    char_id = {c: len(SPECIAL_TOKENS) + i for i, c in enumerate(DEFAULT_ALPHABET)}
    prompts = []
    for _ in range(num):
        text = f"{rng.randint(100, 999)}+{rng.randint(100, 999)}"
        prompts.append([BOS_ID, USER_ID, *(char_id[c] for c in text), ASST_ID])
    return prompts


def timed(fn, repeats: int) -> tuple[int, float]:
    """One warm-up call, then the fastest of ``repeats``: (generated tokens, seconds)."""
    fn()
    best = None
    for _ in range(repeats):
        start = time.perf_counter()
        tokens = fn()
        elapsed = time.perf_counter() - start
        if best is None or tokens / elapsed > best[0] / best[1]:
            best = (tokens, elapsed)
    return best


def run_vllm(hf_dir: Path, prompts, args) -> dict:
    from safetensors.numpy import load_file

    from actors.engine import RolloutEngine, SamplingSpec

    engine = RolloutEngine(hf_dir, max_model_len=128, kv_cache_gib=1, seed=0)
    spec = SamplingSpec(n=args.group_size, temperature=args.temperature, max_tokens=args.max_tokens)
    tokens, seconds = timed(lambda: sum(len(s.token_ids) for g in engine.generate(prompts, spec) for s in g),
                            args.repeats)
    # what an actor's sampling loop loses per weight version: validate + load in place
    tensors = load_file(str(hf_dir / "model.safetensors"))
    stalls = [engine.load_weights(tensors.items()) for _ in range(args.repeats)]
    return {"tokens": tokens, "seconds": seconds, "stall_seconds": min(stalls),
            "weight_mb": sum(a.nbytes for a in tensors.values()) / 2**20}


def run_transformers(hf_dir: Path, prompts, args) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    from models.tokenizer import EOS_ID, PAD_ID

    model = AutoModelForCausalLM.from_pretrained(str(hf_dir), dtype=torch.float32).eval()
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[PAD_ID] * (width - len(p)) + p for p in prompts])  # left padding
    mask = (torch.arange(width)[None, :] >= torch.tensor([width - len(p) for p in prompts])[:, None]).long()

    @torch.no_grad()
    def generate() -> int:
        out = model.generate(input_ids=ids, attention_mask=mask, do_sample=True, temperature=args.temperature,
                             top_p=1.0, top_k=0, max_new_tokens=args.max_tokens,
                             num_return_sequences=args.group_size, eos_token_id=EOS_ID, pad_token_id=PAD_ID)
        new = out[:, width:]
        # tokens up to and including the first EOS, as vLLM counts them
        is_eos = (new == EOS_ID).int()
        after_eos = (torch.cumsum(is_eos, dim=1) - is_eos) > 0
        return int((~after_eos).sum())

    tokens, seconds = timed(generate, args.repeats)
    return {"tokens": tokens, "seconds": seconds}


def child(args) -> None:
    prompts = make_prompts(args.prompts, args.seed)
    run = run_vllm if args.backend == "vllm" else run_transformers
    print(json.dumps(run(Path(args.hf_dir), prompts, args)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--backend", choices=["vllm", "transformers"], help=argparse.SUPPRESS)
    parser.add_argument("--hf-dir", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.backend:
        child(args)
        return

    from models.tiny import make_tiny_model

    with tempfile.TemporaryDirectory() as tmp:
        hf_dir = make_tiny_model(Path(tmp) / "model", **MODEL)
        results = {}
        for backend in ("transformers", "vllm"):
            cmd = [sys.executable, __file__, "--backend", backend, "--hf-dir", str(hf_dir), *sys.argv[1:]]
            proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
            if proc.returncode != 0:
                sys.exit(f"{backend} run failed:\n{proc.stderr[-3000:]}")
            results[backend] = json.loads(proc.stdout.strip().splitlines()[-1])
    print(f"model: tiny qwen2 {MODEL}; {args.prompts} prompts x G={args.group_size} x "
          f"max {args.max_tokens} tokens, T={args.temperature}, best of {args.repeats}")
    for backend, r in results.items():
        rate = r["tokens"] / r["seconds"]
        print(f"{backend:>12}: {r['tokens']:6d} tokens in {r['seconds']:.3f} s = {rate:8.0f} tok/s")
    ratio = (results["vllm"]["tokens"] / results["vllm"]["seconds"]) / (
        results["transformers"]["tokens"] / results["transformers"]["seconds"])
    print(f"vllm / transformers throughput ratio: {ratio:.2f}x")
    print(f"weight update stall (validate + load {results['vllm']['weight_mb']:.1f} MB in place): "
          f"{results['vllm']['stall_seconds'] * 1000:.1f} ms")


if __name__ == "__main__":
    main()

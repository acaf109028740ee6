"""Rollout throughput: tandem's vLLM RolloutEngine vs transformers ``generate`` on the same tiny model.

Same HF dir, prompts, G, temperature and max_tokens for both, with completions of natural length
(each stops at its EOS, so lengths vary) and of fixed length (EOS ignored: every completion has
max_tokens). Each backend runs in its own subprocess (vLLM lowers torch's thread count for the
whole process it lives in), one warm-up call, then the best of ``--repeats`` timed calls. Prints
generated tokens/s of each and the ratio. ``measure_backend`` is what launch/bench.py calls.

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


def batches(prompts: list[list[int]], size: int) -> list[list[list[int]]]:
    """Prompts in engine calls of ``size`` (0 = all in one call), as an actor leases them."""
    size = size or len(prompts)
    return [prompts[i:i + size] for i in range(0, len(prompts), size)]


def run_vllm(hf_dir: Path, prompts, args) -> dict:
    from safetensors.numpy import load_file
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    from actors.engine import RolloutEngine, SamplingSpec

    engine = RolloutEngine(hf_dir, max_model_len=args.max_model_len, kv_cache_gib=1, seed=0)
    spec = SamplingSpec(n=args.group_size, temperature=args.temperature, max_tokens=args.max_tokens)

    def natural() -> int:
        return sum(len(s.token_ids) for batch in batches(prompts, args.batch)
                   for g in engine.generate(batch, spec) for s in g)

    def fixed() -> int:  # the same engine with EOS ignored (RolloutEngine's spec has no such knob)
        params = SamplingParams(n=args.group_size, temperature=args.temperature, max_tokens=args.max_tokens,
                                ignore_eos=True, logprobs=0)
        return sum(len(c.token_ids) for batch in batches(prompts, args.batch)
                   for out in engine.llm.generate([TokensPrompt(prompt_token_ids=p) for p in batch], params,
                                                  use_tqdm=False) for c in out.outputs)

    result = {length: dict(zip(("tokens", "seconds"), timed(fn, args.repeats), strict=True))
              for length, fn in (("natural", natural), ("fixed", fixed)) if length in args.lengths}
    # what an actor's sampling loop loses per weight version: validate + load in place
    tensors = load_file(str(hf_dir / "model.safetensors"))
    stalls = [engine.load_weights(tensors.items()) for _ in range(args.repeats)]
    weight_mb = sum(a.nbytes for a in tensors.values()) / 2**20
    return {**result, "stall_seconds": min(stalls), "weight_mb": weight_mb}


def run_transformers(hf_dir: Path, prompts, args) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    from models.tokenizer import EOS_ID, PAD_ID

    model = AutoModelForCausalLM.from_pretrained(str(hf_dir), dtype=torch.float32).eval()
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[PAD_ID] * (width - len(p)) + p for p in prompts])  # left padding
    mask = (torch.arange(width)[None, :] >= torch.tensor([width - len(p) for p in prompts])[:, None]).long()

    @torch.no_grad()
    def generate(fixed: bool) -> int:
        tokens = 0
        for rows in batches(list(range(len(prompts))), args.batch):
            out = model.generate(input_ids=ids[rows], attention_mask=mask[rows], do_sample=True,
                                 temperature=args.temperature, top_p=1.0, top_k=0,
                                 max_new_tokens=args.max_tokens,
                                 min_new_tokens=args.max_tokens if fixed else None,
                                 num_return_sequences=args.group_size, eos_token_id=EOS_ID,
                                 pad_token_id=PAD_ID)
            new = out[:, width:]
            # tokens up to and including the first EOS, as vLLM counts them
            is_eos = (new == EOS_ID).int()
            after_eos = (torch.cumsum(is_eos, dim=1) - is_eos) > 0
            tokens += int((~after_eos).sum())
        return tokens

    return {length: dict(zip(("tokens", "seconds"), timed(lambda f=length == "fixed": generate(f),
                                                         args.repeats), strict=True))
            for length in ("natural", "fixed") if length in args.lengths}


def child(args) -> None:
    if args.cpus:
        os.sched_setaffinity(0, {int(c) for c in args.cpus.split(",")})  # before torch starts its threads
    prompts = json.loads(Path(args.prompt_file).read_text()) if args.prompt_file else make_prompts(
        args.prompts, args.seed)
    run = run_vllm if args.backend == "vllm" else run_transformers
    print(json.dumps(run(Path(args.hf_dir), prompts, args)))


def measure_backend(backend: str, hf_dir: Path, *, prompts: list[list[int]] | None = None,
                    num_prompts: int = 32, group_size: int = 8, max_tokens: int = 64,
                    temperature: float = 1.0, repeats: int = 3, batch: int = 0, max_model_len: int = 128,
                    lengths: tuple[str, ...] = ("natural", "fixed"), cpus: str = "") -> dict:
    """Run one backend in its own subprocess; {length: {tokens, seconds}} (+ stall_seconds, weight_mb for
    vllm). ``prompts`` default to ``num_prompts`` synthetic ones; ``batch`` prompts per call (0 = all);
    ``cpus`` pins the subprocess (e.g. "0")."""
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, __file__, "--backend", backend, "--hf-dir", str(hf_dir),
               "--prompts", str(num_prompts), "--group-size", str(group_size),
               "--max-tokens", str(max_tokens), "--temperature", str(temperature),
               "--repeats", str(repeats), "--batch", str(batch), "--max-model-len", str(max_model_len),
               "--lengths", *lengths, "--cpus", cpus]
        if prompts is not None:
            prompt_file = Path(tmp) / "prompts.json"
            prompt_file.write_text(json.dumps(prompts))
            cmd += ["--prompt-file", str(prompt_file)]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{backend} run failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def rate(result: dict) -> float:
    return result["tokens"] / result["seconds"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch", type=int, default=0, help="prompts per generate call (0 = all)")
    parser.add_argument("--max-model-len", type=int, default=128)
    parser.add_argument("--lengths", nargs="+", default=["natural", "fixed"], choices=["natural", "fixed"])
    parser.add_argument("--backend", choices=["vllm", "transformers"], help=argparse.SUPPRESS)
    parser.add_argument("--hf-dir", help=argparse.SUPPRESS)
    parser.add_argument("--prompt-file", help=argparse.SUPPRESS)
    parser.add_argument("--cpus", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.backend:
        child(args)
        return

    from models.tiny import make_tiny_model

    with tempfile.TemporaryDirectory() as tmp:
        hf_dir = make_tiny_model(Path(tmp) / "model", **MODEL)
        results = {backend: measure_backend(backend, hf_dir, num_prompts=args.prompts,
                                            group_size=args.group_size, max_tokens=args.max_tokens,
                                            temperature=args.temperature, repeats=args.repeats,
                                            batch=args.batch, max_model_len=args.max_model_len,
                                            lengths=tuple(args.lengths))
                   for backend in ("transformers", "vllm")}
    print(f"model: tiny qwen2 {MODEL}; {args.prompts} prompts x G={args.group_size} x "
          f"max {args.max_tokens} tokens, T={args.temperature}, best of {args.repeats}")
    for length in args.lengths:
        for backend, r in results.items():
            print(f"{length:>8} {backend:>12}: {r[length]['tokens']:6d} tokens in "
                  f"{r[length]['seconds']:.3f} s = {rate(r[length]):8.0f} tok/s")
        print(f"{length:>8} vllm / transformers throughput ratio: "
              f"{rate(results['vllm'][length]) / rate(results['transformers'][length]):.2f}x")
    print(f"weight update stall (validate + load {results['vllm']['weight_mb']:.1f} MB in place): "
          f"{results['vllm']['stall_seconds'] * 1000:.1f} ms")


if __name__ == "__main__":
    main()

"""Padding in RL batches: packed rows (learner.algo.rl_batch, now) against one sequence a row padded to a
power-of-two length bucket (the learner's layout until 2026-12-04), on the demo's lengths and on GSM8K-shaped
ones.

    .venv/bin/python tests/benchmarks/bench_packing.py [--model runs/demo/sft/hf_selected --data runs/demo/data]

demo: 32 prompts of the demo's RL data (chat-format differences, tokenized with the model's chat template) ×
8 completions each, a completion being the right answer or a wrong one of the lengths a policy gives (2-3
digits + eos, or cut at rollout.max_tokens = 8); rows of the longest sequence (max_prompt_tokens 24 + 8).
gsm8k: 32 prompts of 60-250 tokens × 8 completions, lognormal around 180 tokens capped at 512; rows of
250 + 512 tokens. Prints one JSON line: for each, the padding fraction of both layouts, rows and sequences.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]


def padded_fraction(lengths: np.ndarray) -> float:
    """One sequence a row, every row padded to the smallest power of two holding the longest."""
    bucket = 2 ** int(np.ceil(np.log2(lengths.max())))
    return 1 - lengths.sum() / (len(lengths) * bucket)


def packed(lengths: np.ndarray, row_tokens: int) -> dict[str, float]:
    from learner.algo.rl_batch import pack

    rows = pack([int(n) for n in lengths], row_tokens)
    return {"rows": len(rows), "padding": 1 - lengths.sum() / (len(rows) * row_tokens)}


def demo_lengths(model: Path, data: Path, rng: np.random.Generator) -> np.ndarray:
    from transformers import AutoTokenizer

    from launch.prompts import chat_prompt_rows

    prompts = chat_prompt_rows(str(data / "rl.jsonl"), AutoTokenizer.from_pretrained(model), limit=32)
    completions = rng.choice([3, 4, 4, 3, 8], size=(len(prompts), 8))  # digits + eos; a few run to max_tokens
    return (np.array([len(p.prompt_ids) for p in prompts])[:, None] + completions).ravel()


def gsm8k_lengths(rng: np.random.Generator) -> np.ndarray:
    prompts = rng.integers(60, 250, 32)
    completions = np.minimum(rng.lognormal(np.log(180), 0.6, (32, 8)).astype(int) + 1, 512)
    return (prompts[:, None] + completions).ravel()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="runs/demo/sft/hf_selected", help="a demo checkpoint (its tokenizer)")
    parser.add_argument("--data", default="runs/demo/data", help="the demo's data dir")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    rng = np.random.default_rng(0)
    cases = {"demo": (demo_lengths(Path(args.model), Path(args.data), rng), 24 + 8),
             "gsm8k": (gsm8k_lengths(rng), 250 + 512)}
    print(json.dumps({name: {"sequences": len(lengths), "padded_fraction": round(padded_fraction(lengths), 4),
                             "packed_fraction": round(packed(lengths, row)["padding"], 4),
                             "packed_rows": packed(lengths, row)["rows"], "row_tokens": row}
                      for name, (lengths, row) in cases.items()}))


if __name__ == "__main__":
    main()

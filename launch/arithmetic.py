"""The embedded demo's synthetic task: addition of two n-digit numbers, generated locally.

One held-out set of pairs is drawn first and excluded from every training stage, so the
accuracy printed after pretraining, SFT and RL is measured on pairs the model never saw.
Files written (jsonl, `datasets`-loadable):
  pretrain.jsonl  {"text": "123+456=579"}  (+ a fraction of subtraction lines as distractors)
  sft.jsonl       {"messages": [{"role": "user", "content": "123+456"},
                                {"role": "assistant", "content": "579"}]}
  rl.jsonl        {"prompt": "123+456", "answer": "579"}
  heldout.jsonl   {"prompt": ..., "answer": ...}
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path

ALPHABET = "0123456789+-="


def _pairs(rng: random.Random, digits: int, excluded: set[tuple[int, int]]) -> Iterator[tuple[int, int]]:
    low, high = 10 ** (digits - 1), 10**digits - 1
    while True:
        pair = (rng.randint(low, high), rng.randint(low, high))
        if pair not in excluded:
            yield pair


def _write_jsonl(path: Path, rows: Iterator[dict] | list[dict]) -> Path:
    with path.open("w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    return path


def make_arithmetic_data(
    out_dir: Path,
    *,
    seed: int = 0,
    digits: int = 3,
    heldout: int = 512,
    pretrain_lines: int = 200_000,
    sft_examples: int = 20_000,
    rl_prompts: int = 20_000,
    subtraction_fraction: float = 0.3,
) -> dict[str, Path]:
    """Write the four splits under out_dir and return their paths (idempotent for a seed)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    held: set[tuple[int, int]] = set()
    for pair in _pairs(rng, digits, held):
        held.add(pair)
        if len(held) == heldout:
            break
    heldout_pairs = sorted(held)
    train = _pairs(rng, digits, held)

    def pretrain_rows() -> Iterator[dict]:
        for _ in range(pretrain_lines):
            a, b = next(train)
            if rng.random() < subtraction_fraction:
                yield {"text": f"{max(a, b)}-{min(a, b)}={max(a, b) - min(a, b)}"}
            else:
                yield {"text": f"{a}+{b}={a + b}"}

    def chat_rows(count: int) -> Iterator[tuple[str, str]]:
        for _ in range(count):
            a, b = next(train)
            yield f"{a}+{b}", str(a + b)

    paths = {
        "pretrain": _write_jsonl(out_dir / "pretrain.jsonl", pretrain_rows()),
        "sft": _write_jsonl(
            out_dir / "sft.jsonl",
            ({"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]}
             for q, a in chat_rows(sft_examples)),
        ),
        "rl": _write_jsonl(out_dir / "rl.jsonl", ({"prompt": q, "answer": a} for q, a in chat_rows(rl_prompts))),
        "heldout": _write_jsonl(
            out_dir / "heldout.jsonl", [{"prompt": f"{a}+{b}", "answer": str(a + b)} for a, b in heldout_pairs]
        ),
    }
    return paths

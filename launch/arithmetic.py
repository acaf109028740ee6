"""The embedded demo's synthetic task: arithmetic on n-digit numbers, generated locally.

The stages are chosen so that RL has room to improve for a reason that does not depend on how far
a stage happened to train (see docs/demo.md, "Why this design"):
  pretraining  plain-text lines with both operations: "123+456=579" and "579-123=456";
  SFT          the chat format, with *addition only*: "<user>123+456<asst>" -> "579<eos>", among
               plain-text lines replayed from pretraining's distribution (half the rows), which
               keep SFT from overwriting the differences pretraining taught;
  RL           chat-format *subtraction*, "<user>579-123<asst>": no supervised example shows
               it, so only the verifier (exact match) says which answer is right.

Held-out pairs are drawn first and excluded from every stage (as unordered pairs, so neither
operation of a held-out pair is ever trained on). Files written (jsonl, `datasets`-loadable):
  pretrain.jsonl          {"text": "123+456=579"} / {"text": "579-123=456"}
  sft.jsonl               {"messages": [{"role": "user", "content": "123+456"},
                                        {"role": "assistant", "content": "579"}]}
                          and, replayed, {"text": "123+456=579"} / {"text": "579-123=456"}
  rl.jsonl                {"prompt": "579-123", "answer": "456"}
  heldout.jsonl           the RL task on held-out pairs (chat subtraction): every stage's eval
  heldout_addition.jsonl  the SFT task on held-out pairs (chat addition)
  heldout_raw.jsonl       plain-text subtraction on held-out pairs, {"prompt": "579-123=", ...}:
                          what pretraining alone can do (evaluate with prompt_format="raw")
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Iterator
from pathlib import Path

from launch.json_files import write_jsonl

ALPHABET = "0123456789+-="
SPLITS = ("pretrain", "sft", "rl", "heldout", "heldout_addition", "heldout_raw")


def _pairs(rng: random.Random, digits: int, excluded: set[tuple[int, int]]) -> Iterator[tuple[int, int]]:
    """Random (a, b) of `digits` digits each, never one whose unordered pair is in `excluded`."""
    low, high = 10 ** (digits - 1), 10**digits - 1
    while True:
        a, b = rng.randint(low, high), rng.randint(low, high)
        if (min(a, b), max(a, b)) not in excluded:
            yield a, b


def addition(a: int, b: int) -> tuple[str, str]:
    return f"{a}+{b}", str(a + b)


def subtraction(a: int, b: int) -> tuple[str, str]:
    """The larger minus the smaller, so every answer is a non-negative number."""
    return f"{max(a, b)}-{min(a, b)}", str(abs(a - b))


def make_arithmetic_data(
    out_dir: Path,
    *,
    seed: int = 0,
    digits: int = 3,
    heldout: int = 512,
    pretrain_lines: int = 400_000,
    sft_examples: int = 20_000,
    rl_prompts: int = 20_000,
    subtraction_fraction: float = 0.5,
    sft_replay_fraction: float = 0.5,
) -> dict[str, Path]:
    """Write the splits under out_dir and return their paths (deterministic for a seed)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    held: set[tuple[int, int]] = set()
    held_order: list[tuple[int, int]] = []
    for a, b in _pairs(rng, digits, held):
        held.add((min(a, b), max(a, b)))
        held_order.append((a, b))
        if len(held_order) == 2 * heldout:
            break
    held_sub, held_add = held_order[:heldout], held_order[heldout:]
    train = _pairs(rng, digits, held)

    def plain_line() -> dict:
        operation = subtraction if rng.random() < subtraction_fraction else addition
        question, answer = operation(*next(train))
        return {"text": f"{question}={answer}"}

    def chat(question: str, answer: str) -> dict:
        return {"messages": [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]}

    def sft_rows() -> Iterator[dict]:
        for _ in range(sft_examples):
            yield plain_line() if rng.random() < sft_replay_fraction else chat(*addition(*next(train)))

    def prompts(operation, pairs: Iterable[tuple[int, int]], suffix: str = "") -> Iterator[dict]:
        for pair in pairs:
            question, answer = operation(*pair)
            yield {"prompt": question + suffix, "answer": answer}

    def fresh(count: int) -> Iterator[tuple[int, int]]:
        return (next(train) for _ in range(count))

    return {
        "pretrain": write_jsonl(out_dir / "pretrain.jsonl", (plain_line() for _ in range(pretrain_lines))),
        "sft": write_jsonl(out_dir / "sft.jsonl", sft_rows()),
        "rl": write_jsonl(out_dir / "rl.jsonl", prompts(subtraction, fresh(rl_prompts))),
        "heldout": write_jsonl(out_dir / "heldout.jsonl", prompts(subtraction, held_sub)),
        "heldout_addition": write_jsonl(out_dir / "heldout_addition.jsonl", prompts(addition, held_add)),
        "heldout_raw": write_jsonl(out_dir / "heldout_raw.jsonl", prompts(subtraction, held_sub, "=")),
    }

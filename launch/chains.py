"""A synthetic task whose answers have long-tailed lengths, for the RL loop's benchmarks: countdown chains.

    "<user>87-9<asst>"  ->  "78 69 60 51 42 33 24 15 6<eos>"

Subtract b from a, again and again while what is left is at least b, writing every intermediate
result: a reasoning trace in miniature, whose length (floor(a / b) numbers) is set by the question.
The number of terms is drawn log-uniformly from 1 to `max_terms` (b uniform over 1..9, a = terms * b
plus a remainder below b), so completions run from 2 to about 4 * max_terms tokens with a long tail,
the shape of the reasoning traces GRPO trains on (most short, a few very long), which is what
in-flight weight updates are about: the longest sequences are the ones an update catches unfinished.

Stages, built like the demo's (launch/arithmetic.py) so that RL has something to learn:
  pretraining  plain text of every length: "87-9=78 69 60 51 42 33 24 15 6";
  SFT          the chat format on *short* chains only (at most SFT_MAX_TERMS numbers), half the rows
               plain text replayed from pretraining's distribution;
  RL           chat chains of every length: the long ones in the chat format no supervised example showed.
Reward: exact match of the whole chain (`exact_match`). Held-out (a, b) pairs are drawn first and
excluded from every stage. Files (jsonl): pretrain, sft, rl, heldout (the RL task on held-out pairs) and
heldout_raw (plain-text prompts "87-9=", what pretraining alone can do; prompt_format="raw").
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator
from pathlib import Path

from launch.json_files import write_jsonl

SPLITS = ("pretrain", "sft", "rl", "heldout", "heldout_raw")
MIN_START = 10  # a has at least two digits, so no question is a one-character "5-1"
SFT_MAX_TERMS = 8  # SFT's chats: chains of at most 8 numbers (~30 tokens); the long ones are RL's to learn
SFT_REPLAY_FRACTION = 0.5  # SFT rows that are plain-text chains of every length, as the demo's replay


def chain(a: int, b: int) -> tuple[str, str]:
    """("a-b", "a-b a-2b ... a mod b"): the question and its trace, floor(a / b) numbers."""
    if not (a >= b >= 1):
        raise ValueError(f"a chain needs a >= b >= 1, got a={a}, b={b}")
    return f"{a}-{b}", " ".join(str(x) for x in range(a - b, -1, -b))


def chain_tokens(answer: str) -> int:
    """Completion tokens of an answer under the character tokenizer (models/tokenizer.py), EOS included."""
    return len(answer) + 1


def _draw(rng: random.Random, max_terms: int) -> tuple[int, int]:
    """(a, b) with log-uniform floor(a / b) in [1, max_terms] and a >= MIN_START."""
    while True:
        terms = int(math.exp(rng.uniform(0.0, math.log(max_terms + 1))))
        b = rng.randint(1, 9)
        a = terms * b + rng.randint(0, b - 1)
        if terms <= max_terms and a >= MIN_START:
            return a, b


def make_chain_data(out_dir: Path, *, seed: int = 0, max_terms: int = 64, heldout: int = 256,
                    pretrain_lines: int = 100_000, sft_examples: int = 20_000,
                    rl_prompts: int = 20_000) -> dict[str, Path]:
    """Write the splits under out_dir and return their paths (deterministic for a seed)."""
    rng = random.Random(seed)
    held: list[tuple[int, int]] = []
    while len(held) < heldout:
        pair = _draw(rng, max_terms)
        if pair not in held:
            held.append(pair)
    excluded = set(held)

    def train(most_terms: int = max_terms) -> Iterator[tuple[int, int]]:
        while True:
            pair = _draw(rng, most_terms)
            if pair not in excluded:
                yield pair

    def plain(pair: tuple[int, int]) -> dict:
        question, answer = chain(*pair)
        return {"text": f"{question}={answer}"}

    def sft_rows() -> Iterator[dict]:
        plain_pairs, short_pairs = train(), train(SFT_MAX_TERMS)
        for _ in range(sft_examples):
            if rng.random() < SFT_REPLAY_FRACTION:
                yield plain(next(plain_pairs))
            else:
                question, answer = chain(*next(short_pairs))
                yield {"messages": [{"role": "user", "content": question},
                                    {"role": "assistant", "content": answer}]}

    def prompts(pairs, suffix: str = "") -> Iterator[dict]:
        for pair in pairs:
            question, answer = chain(*pair)
            yield {"prompt": question + suffix, "answer": answer}

    pretrain_pairs, rl_pairs = train(), train()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    return {
        "pretrain": write_jsonl(out_dir / "pretrain.jsonl", (plain(next(pretrain_pairs))
                                                            for _ in range(pretrain_lines))),
        "sft": write_jsonl(out_dir / "sft.jsonl", sft_rows()),
        "rl": write_jsonl(out_dir / "rl.jsonl", prompts(next(rl_pairs) for _ in range(rl_prompts))),
        "heldout": write_jsonl(out_dir / "heldout.jsonl", prompts(held)),
        "heldout_raw": write_jsonl(out_dir / "heldout_raw.jsonl", prompts(held, "=")),
    }

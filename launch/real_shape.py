"""A real model's path without a download: a Qwen2.5-0.5B-shaped checkpoint with random weights, GSM8K-
shaped rows, and the overrides that run launch/configs/qwen_gsm8k_gpu.yaml on them at small sizes.

The real-shape test (tests/test_real_shape.py) and the accelerator check (launch/device_check.py) share
it, so both run the shipped config's code path: bf16 compute with float32 master weights, GSPO, rows read
through data.prompt_field / data.answer_field and the config's prompt template.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from launch.json_files import write_jsonl

CONFIG = Path(__file__).resolve().parent / "configs" / "qwen_gsm8k_gpu.yaml"
# A random model of a real vocabulary meets this format check about half the time (the first sampled
# token is one of the filler ids beginning with 1, models.tokenizer.build_chatml_tokenizer), so RL
# groups carry signal; a real checkpoint keeps the config's math_answer.
RANDOM_MODEL_REWARD = "rewards.functions=[{ref: format_regex, kwargs: {pattern: '^<x1'}}]"


def gsm8k_style_rows(n: int, seed: int = 0) -> list[dict]:
    """Rows shaped like openai/gsm8k: a question, and a worked answer ending '#### <number>'."""
    rng = np.random.default_rng(seed)
    rows = []
    for a, b in rng.integers(2, 99, size=(n, 2)).tolist():
        rows.append({"question": f"Tom has {a} apples and buys {b} more. How many apples does he have?",
                     "answer": f"He has {a} + {b} = <<{a}+{b}={a + b}>>{a + b} apples.\n#### {a + b}"})
    return rows


def write_gsm8k_style_data(out_dir: Path, *, train: int = 48, held_out: int = 16, seed: int = 0) -> dict[str, str]:
    """train / test jsonl of GSM8K-shaped rows, and sft.jsonl of the train rows as question/completion."""
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = gsm8k_style_rows(train + held_out, seed)
    files = {"train": write_jsonl(out_dir / "gsm8k_train.jsonl", rows[:train]),
             "eval": write_jsonl(out_dir / "gsm8k_test.jsonl", rows[train:]),
             "sft": write_jsonl(out_dir / "sft.jsonl", [{"question": r["question"], "completion": r["answer"]}
                                                        for r in rows[:train]])}
    return {split: str(path) for split, path in files.items()}


def rl_overrides(*, prompts: int, group_size: int, fleet_name: str) -> list[str]:
    """One actor, one reward worker and `prompts` × `group_size` completions per step, every step an
    update (train.skip_no_signal=false), on loopback."""
    return [f"train.prompts_per_step={prompts}", f"rollout.prompts_per_batch={prompts}",
            f"rollout.group_size={group_size}", "rollout.num_actors=1", "rollout.num_cpus=1",
            f"rollout.queue_capacity={4 * prompts}", "rewards.num_workers=1", "train.skip_no_signal=false",
            "train.eval_every=0", "server.host=127.0.0.1", f"rollout.fleet_name={fleet_name}"]

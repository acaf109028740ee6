"""Prompt rows of a dataset, tokenized the way the rollout engines and the evaluator see them."""

from __future__ import annotations

from launch.config import ConfigError
from learner.data import load_rows, pretrain_documents
from learner.prompt_source import Prompt


def chat_prompt_rows(path: str, tokenizer, *, split: str = "train", limit: int | None = None,
                     prompt_format: str = "chat") -> list[Prompt]:
    """RL/eval rows {prompt, answer, ...} → Prompts (the learner's). prompt_ids is the chat template
    with the generation prompt ('chat'), or the text as a pretraining document begins ('raw': bos + text)."""
    rows = load_rows(path, split)
    if "prompt" not in rows.column_names:
        raise ConfigError(f"{path}: rl/eval data needs a 'prompt' column, has {rows.column_names}")
    if limit is not None:
        rows = rows.select(range(min(limit, len(rows))))
    out = []
    for row in rows:
        if prompt_format == "raw":
            ids = pretrain_documents(tokenizer, [row["prompt"]])[0][:-1]  # without the end-of-document
        else:
            ids = tokenizer.apply_chat_template([{"role": "user", "content": row["prompt"]}], tokenize=True,
                                                add_generation_prompt=True, return_dict=False)
        metadata = {k: str(v) for k, v in row.items() if k != "prompt"}
        out.append(Prompt(list(ids), row["prompt"], metadata))
    return out

"""Prompt rows of a dataset, tokenized the way the rollout engines and the evaluator see them."""

from __future__ import annotations

from launch.config import ConfigError, DataConfig
from learner.data import chat_template_ids, load_rows, pretrain_documents
from learner.service.prompt_source import Prompt


def chat_prompt_rows(path: str, tokenizer, data: DataConfig | None = None, *, split: str = "train",
                     limit: int | None = None, prompt_format: str = "chat",
                     tools: list[dict] | None = None) -> list[Prompt]:
    """RL/eval rows → Prompts (the learner's), with the columns and template of the run's `data`
    section (default: its defaults). 'chat': prompt_ids is the chat template of [system_prompt?,
    user(prompt_template(prompt column))] with the generation prompt (and `tools`, the environment's tool
    schemas, given to the template), and text that user message;
    'raw': the prompt column as a pretraining document begins (bos + text), no template or system.
    metadata: every other column as a string, and `answer` the answer column's (whatever its name)."""
    data = data or DataConfig()
    rows = load_rows(path, split)
    for key in ("prompt_field", "answer_field"):
        if getattr(data, key) not in rows.column_names:
            raise ConfigError(f"{path}: rl/eval data needs the column data.{key}={getattr(data, key)!r}; "
                              f"the data has columns {rows.column_names}")
    if limit is not None:
        rows = rows.select(range(min(limit, len(rows))))
    out = []
    for row in rows:
        prompt = row[data.prompt_field]
        if prompt_format == "raw":
            text = prompt
            ids = pretrain_documents(tokenizer, [prompt])[0][:-1]  # without the end-of-document
        else:
            messages = data.prompt_messages(prompt)
            text = messages[-1]["content"]
            try:
                ids = chat_template_ids(tokenizer, messages, add_generation_prompt=True, tools=tools)
            except ValueError as error:
                raise ConfigError(f"{path}: {error}") from None
        metadata = {k: str(v) for k, v in row.items() if k != data.prompt_field}
        metadata["answer"] = str(row[data.answer_field])
        out.append(Prompt(list(ids), text, metadata))
    return out

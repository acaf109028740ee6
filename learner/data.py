"""SFT and pretrain data: load a dataset, tokenize it, pack examples into fixed-shape batches.

- **SFT**: rows of chat `messages`, or prompt/completion rows (made into [system?, user, assistant]
  messages by `ChatFormat`), rendered with the tokenizer's chat template; only the assistant turns
  carry loss (completion-only labels).
- **Pretrain**: rows of `text`; every token carries loss; documents are wrapped in bos/eos.

Packing: several examples share one row of `seq_len` tokens. Each example is a *segment*
(`segment_ids` 1, 2, ... per row, 0 = padding) with positions restarting at 0, so a forward that
honours segments attends only within an example (see learner.algo.train_step for how the model is
called). An SFT example never straddles rows (one longer than `seq_len` is truncated); pretrain
documents are cut at row ends and continue at the start of the next row (usual pretrain packing).
The first token of every segment is not a target: nothing in its segment precedes it.

Data position: `DataPosition(epoch, index, offset, seed)` says where the next batch starts (the
`index`-th example of epoch `epoch`'s shuffled order, `offset` tokens into it). The order of an
epoch is a pure function of (seed, epoch), so restoring a checkpointed position continues exactly.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal, NamedTuple

import datasets
import jinja2
import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from learner.chat_format import ChatFormat

DataKind = Literal["sft", "pretrain"]

# Local files are loaded with the datasets builder named by their extension.
_BUILDER_BY_SUFFIX = {".json": "json", ".jsonl": "json", ".parquet": "parquet", ".arrow": "arrow",
                      ".csv": "csv", ".txt": "text"}


class DataConfig(ChatFormat):
    """Where the data is and how it becomes batches of `batch_size` rows × `seq_len` tokens; SFT rows
    without `messages_field` are prompt/completion rows, made into chats by the ChatFormat fields."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: DataKind
    source: str | list[str]  # local file(s) (json/jsonl/parquet/arrow/csv/txt) or a hub dataset name
    split: str = "train"
    seq_len: int = Field(gt=1)
    batch_size: int = Field(gt=0)
    seed: int = 0
    shuffle: bool = True
    messages_field: str = "messages"  # sft (else prompt_field and completion_field)
    text_field: str = "text"  # pretrain; sft rows with a text and no messages (pretraining replay)
    num_proc: int | None = None  # tokenization processes (datasets.map)


class DataPosition(BaseModel):
    """Where the next batch starts; JSON-serialisable so checkpoints can carry it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    epoch: int = Field(0, ge=0)
    index: int = Field(0, ge=0)  # examples of this epoch's order fully consumed
    offset: int = Field(0, ge=0)  # tokens of example `index` already consumed (pretrain only)
    seed: int = 0


class TokenBatch(NamedTuple):
    """A packed batch, numpy, all [B, T]. loss_mask[b, t] = 1 iff token t is a target (from t−1)."""

    input_ids: np.ndarray  # int32, pad_id where segment_ids == 0
    attention_mask: np.ndarray  # int32, 1 on real tokens
    loss_mask: np.ndarray  # float32
    segment_ids: np.ndarray  # int32, 1.. per packed example, 0 = padding
    positions: np.ndarray  # int32, restarting at 0 in every segment


def load_rows(source: str | list[str], split: str = "train") -> datasets.Dataset:
    """Local files via the builder their extension names, otherwise a hub dataset (needs a network)."""
    files = [source] if isinstance(source, str) else list(source)
    suffixes = {Path(f).suffix.lower() for f in files}
    if all(Path(f).exists() for f in files):
        if len(suffixes) != 1 or next(iter(suffixes)) not in _BUILDER_BY_SUFFIX:
            raise ValueError(f"local data files need one extension of {sorted(_BUILDER_BY_SUFFIX)}, "
                             f"got {sorted(suffixes)}")
        return datasets.load_dataset(_BUILDER_BY_SUFFIX[suffixes.pop()], data_files=files, split="train")
    if len(files) != 1:
        raise FileNotFoundError(f"data files not found: {[f for f in files if not Path(f).exists()]}")
    return datasets.load_dataset(files[0], split=split)


def chat_template_ids(tokenizer, messages: list[dict], add_generation_prompt: bool = False,
                      tools: list[dict] | None = None) -> list[int]:
    """The tokenizer's chat template of ``messages`` (and of `tools`' schemas, for a template that renders
    them); a template that refuses them (a system prompt given to a template without a system role)
    fails naming the roles."""
    try:
        ids = tokenizer.apply_chat_template(messages, tokenize=True, return_dict=False, tools=tools,
                                            add_generation_prompt=add_generation_prompt)
    except jinja2.TemplateError as error:
        roles = [m.get("role") for m in messages]
        hint = (" (a system_prompt needs a chat template with a system role: leave it unset and put the "
                "instruction in the prompt_template instead)" if "system" in roles else "")
        raise ValueError(f"the tokenizer's chat template cannot render roles {roles}: {error}{hint}") from None
    return list(ids)


def sft_example(tokenizer, messages: list[dict[str, Any]]) -> tuple[list[int], list[int]]:
    """Token ids of a conversation and its loss mask (1 on assistant-turn tokens, incl. end-of-turn).

    An assistant turn's tokens are found by rendering the prefix before it (with the generation
    prompt) and the prefix including it: what lies between is what the model must produce. This
    works for any chat template that renders a conversation's prefixes as token prefixes, which is
    checked (transformers' `{% generation %}` masks need template support most templates lack).
    """
    if not messages or any("role" not in m or "content" not in m for m in messages):
        raise ValueError(f"messages must be a non-empty list of {{role, content}} dicts, got {messages!r}")
    ids = chat_template_ids(tokenizer, messages)
    loss_mask = [0] * len(ids)
    for turn, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        start = len(chat_template_ids(tokenizer, messages[:turn], add_generation_prompt=True)) if turn else 0
        end_ids = chat_template_ids(tokenizer, messages[: turn + 1])
        if end_ids != ids[: len(end_ids)] or start > len(end_ids):
            raise ValueError("the chat template does not render conversation prefixes as token prefixes; "
                             "cannot locate assistant tokens")
        loss_mask[start : len(end_ids)] = [1] * (len(end_ids) - start)
    return ids, loss_mask


def pretrain_documents(tokenizer, texts: list[str]) -> list[list[int]]:
    """Token ids of documents: bos (if the tokenizer has one) + text + eos (if it has one).

    One tokenizer call for the whole list: the fast tokenizer batches it (20× faster than one call
    per row on a character tokenizer)."""
    bos = [tokenizer.bos_token_id] if tokenizer.bos_token_id is not None else []
    eos = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    return [bos + list(ids) + eos for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]


def _sft_columns(tokenizer, conversations: list[list[dict] | None],
                 texts: list[str | None] | None = None) -> dict[str, list[list[int]]]:
    """Ids and loss masks of SFT rows; a row with no conversation but a text (`texts`) is a plain-text
    document with loss on every token: pretraining data replayed among the chats, which keeps what
    pretraining taught from being overwritten by a narrow SFT set (docs/demo.md measures it)."""
    texts = texts or [None] * len(conversations)
    examples = []
    for messages, text in zip(conversations, texts, strict=True):
        if messages or text is None:
            examples.append(sft_example(tokenizer, messages))
        else:
            (ids,) = pretrain_documents(tokenizer, [text])
            examples.append((ids, [1] * len(ids)))
    return {"input_ids": [ids for ids, _ in examples], "loss_mask": [mask for _, mask in examples]}


def tokenize_rows(rows: datasets.Dataset, tokenizer, config: DataConfig) -> datasets.Dataset:
    """Columns `input_ids` and `loss_mask` per example; SFT rows without assistant tokens are dropped."""
    columns = rows.column_names
    if config.kind == "sft" and config.messages_field in columns:

        def fn(batch):
            return _sft_columns(tokenizer, batch[config.messages_field], batch.get(config.text_field))
    elif config.kind == "sft":
        pair = (config.prompt_field, config.completion_field)
        if not set(pair) <= set(columns):
            raise ValueError(f"sft data needs a {config.messages_field!r} column (chat messages) or "
                             f"{pair[0]!r} and {pair[1]!r} columns (prompt/completion pairs); the data "
                             f"has {columns}")

        def fn(batch):
            return _sft_columns(tokenizer, [
                [*config.prompt_messages(prompt), {"role": "assistant", "content": completion}]
                for prompt, completion in zip(batch[pair[0]], batch[pair[1]], strict=True)])
    else:
        if config.text_field not in columns:
            raise ValueError(f"pretrain data needs a {config.text_field!r} column; the data has {columns}")

        def fn(batch):
            documents = pretrain_documents(tokenizer, batch[config.text_field])
            return {"input_ids": documents, "loss_mask": [[1] * len(ids) for ids in documents]}
    out = rows.map(fn, batched=True, remove_columns=rows.column_names, num_proc=config.num_proc,
                   desc=f"tokenizing {config.kind} data")
    if config.kind == "sft":
        out = out.filter(lambda row: any(row["loss_mask"]), num_proc=config.num_proc)
    if len(out) == 0:
        raise ValueError(f"no usable {config.kind} examples in {config.source!r}")
    return out


READ_BLOCK = 1024  # examples read from the dataset at once while packing


class PackedBatches:
    """Endless iterator of `TokenBatch`es over tokenized examples, resumable from a `DataPosition`."""

    def __init__(self, examples: datasets.Dataset, *, seq_len: int, batch_size: int, pad_id: int,
                 split_examples: bool, shuffle: bool = True, position: DataPosition | None = None):
        if len(examples) == 0:
            raise ValueError("no examples to pack")
        self._examples = examples.with_format("numpy")
        self._seq_len, self._batch_size, self._pad_id = seq_len, batch_size, pad_id
        self._split, self._shuffle = split_examples, shuffle
        self.truncated = 0  # examples cut to seq_len (sft)
        self._block_key: tuple[int, int] | None = None
        self.position = position or DataPosition()

    @property
    def position(self) -> DataPosition:
        """Where the next batch starts; save it with the checkpoint of the step that used this batch."""
        if self._index >= len(self._order):  # the epoch is used up: the next example opens the next one
            return DataPosition(epoch=self._epoch + 1, index=0, offset=0, seed=self._seed)
        return DataPosition(epoch=self._epoch, index=self._index, offset=self._offset, seed=self._seed)

    @position.setter
    def position(self, position: DataPosition) -> None:
        self._epoch, self._index, self._offset, self._seed = (
            position.epoch, position.index, position.offset, position.seed)
        if self._index > len(self._examples):
            raise ValueError(f"position index {self._index} beyond the {len(self._examples)} examples")
        self._order = self._epoch_order(self._epoch)

    def _epoch_order(self, epoch: int) -> np.ndarray:
        n = len(self._examples)
        if not self._shuffle:
            return np.arange(n)
        return np.random.default_rng([self._seed, epoch]).permutation(n)

    def _peek(self) -> tuple[np.ndarray, np.ndarray]:
        if self._index >= len(self._order):
            self._epoch, self._index, self._offset = self._epoch + 1, 0, 0
            self._order = self._epoch_order(self._epoch)
        ids, mask = self._example(self._index)
        return ids[self._offset :], mask[self._offset :]

    def _example(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        """The example at position `index` of this epoch's order, read READ_BLOCK at a time: one
        `datasets` row read costs ~0.3 ms, which made packing a quarter of a tiny model's step."""
        start = index - index % READ_BLOCK
        if self._block_key != (self._epoch, start):
            block = self._examples[self._order[start : start + READ_BLOCK]]
            self._block, self._block_key = (block["input_ids"], block["loss_mask"]), (self._epoch, start)
        return self._block[0][index - start], self._block[1][index - start]

    def __iter__(self) -> PackedBatches:
        return self

    def __next__(self) -> TokenBatch:
        shape = (self._batch_size, self._seq_len)
        ids = np.full(shape, self._pad_id, np.int32)
        loss = np.zeros(shape, np.float32)
        seg = np.zeros(shape, np.int32)
        pos = np.zeros(shape, np.int32)
        row, col, segment = 0, 0, 1
        while row < self._batch_size:
            tokens, mask = self._peek()
            room = self._seq_len - col
            if len(tokens) > room:
                if not self._split and col > 0:  # an SFT example starts a fresh row rather than straddle
                    row, col, segment = row + 1, 0, 1
                    continue
                if not self._split:
                    self.truncated += 1
                take = room
            else:
                take = len(tokens)
            ids[row, col : col + take] = tokens[:take]
            loss[row, col : col + take] = mask[:take]
            loss[row, col] = 0.0  # a segment's first token has no predecessor in its segment
            seg[row, col : col + take] = segment
            pos[row, col : col + take] = np.arange(take)
            if self._split and take < len(tokens):
                self._offset += take
            else:
                self._index, self._offset = self._index + 1, 0
            col, segment = col + take, segment + 1
            if col == self._seq_len:
                row, col, segment = row + 1, 0, 1
        return TokenBatch(ids, (seg > 0).astype(np.int32), loss, seg, pos)


def make_batches(config: DataConfig, tokenizer, position: DataPosition | None = None) -> PackedBatches:
    """Load, tokenize and pack `config`'s data; `position` resumes (default: seed from the config)."""
    if tokenizer.pad_token_id is None:
        raise ValueError("the tokenizer needs a pad token (padding is never a real token)")
    examples = tokenize_rows(load_rows(config.source, config.split), tokenizer, config)
    return PackedBatches(examples, seq_len=config.seq_len, batch_size=config.batch_size,
                         pad_id=tokenizer.pad_token_id, split_examples=config.kind == "pretrain",
                         shuffle=config.shuffle, position=position or DataPosition(seed=config.seed))

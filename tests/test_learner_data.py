"""SFT / pretrain data: completion-only masks, packing into segments, exact resume from a position."""

from __future__ import annotations

import numpy as np
import pytest
from learner_train_helpers import addition_chats, addition_texts
from transformers import AutoTokenizer

from launch.json_files import write_jsonl
from learner.data import (
    DataConfig,
    DataPosition,
    PackedBatches,
    load_rows,
    make_batches,
    sft_example,
    tokenize_rows,
)
from models.tokenizer import build_char_tokenizer, build_chatml_tokenizer

SEQ, ROWS = 48, 4


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    out = tmp_path_factory.mktemp("tok")
    build_char_tokenizer(out)
    return AutoTokenizer.from_pretrained(out)


@pytest.fixture(scope="module")
def sft_file(tmp_path_factory):
    return write_jsonl(tmp_path_factory.mktemp("sft") / "chats.jsonl", addition_chats(40))


@pytest.fixture(scope="module")
def text_file(tmp_path_factory):
    return write_jsonl(tmp_path_factory.mktemp("pt") / "texts.jsonl", addition_texts(40))


def test_sft_example_masks_exactly_the_assistant_turns(tokenizer):
    messages = [{"role": "user", "content": "12+30"}, {"role": "assistant", "content": "42"},
                {"role": "user", "content": "1+1"}, {"role": "assistant", "content": "2"}]
    ids, mask = sft_example(tokenizer, messages)
    assert tokenizer.decode(ids) == "<bos><user>12+30<asst>42<eos><user>1+1<asst>2<eos>"
    masked = [i for i, m in zip(ids, mask, strict=True) if m]
    assert tokenizer.decode(masked) == "42<eos>2<eos>"
    # the masked runs are exactly the two answers, each ending with eos
    runs = np.flatnonzero(np.diff(np.concatenate([[0], mask, [0]])))
    assert [tokenizer.decode(ids[s:e]) for s, e in runs.reshape(-1, 2)] == ["42<eos>", "2<eos>"]


def test_sft_example_rejects_malformed_messages(tokenizer):
    with pytest.raises(ValueError, match="role, content"):
        sft_example(tokenizer, [{"content": "hi"}])
    with pytest.raises(ValueError, match="non-empty"):
        sft_example(tokenizer, [])


def _examples_in(batch) -> list[tuple[list[int], list[float]]]:
    """(tokens, loss mask) of every segment of a batch, in row order."""
    out = []
    for ids, loss, seg in zip(batch.input_ids, batch.loss_mask, batch.segment_ids, strict=True):
        for s in range(1, seg.max() + 1):
            where = seg == s
            out.append((ids[where].tolist(), loss[where].tolist()))
    return out


def test_sft_packing_keeps_examples_whole_in_segments_with_restarted_positions(tokenizer, sft_file):
    config = DataConfig(kind="sft", source=str(sft_file), seq_len=SEQ, batch_size=ROWS, shuffle=False)
    batches = make_batches(config, tokenizer)
    batch = next(batches)
    expected = [sft_example(tokenizer, row["messages"]) for row in addition_chats(40)]
    got = _examples_in(batch)
    assert len(got) == batches.position.index > ROWS  # several examples per row
    for (ids, loss), (want_ids, want_mask) in zip(got, expected[: len(got)], strict=True):
        assert ids == want_ids
        assert loss == [0.0] + [float(m) for m in want_mask[1:]]
    assert batch.input_ids.shape == (ROWS, SEQ) and batch.input_ids.dtype == np.int32
    for seg, pos in zip(batch.segment_ids, batch.positions, strict=True):
        for s in range(1, seg.max() + 1):
            assert pos[seg == s].tolist() == list(range((seg == s).sum()))
    np.testing.assert_array_equal(batch.attention_mask, batch.segment_ids > 0)
    assert (batch.input_ids[batch.segment_ids == 0] == tokenizer.pad_token_id).all()
    assert (batch.loss_mask[batch.segment_ids == 0] == 0).all()


def test_sft_truncates_examples_longer_than_a_row(tokenizer, sft_file):
    config = DataConfig(kind="sft", source=str(sft_file), seq_len=8, batch_size=2, shuffle=False)
    batches = make_batches(config, tokenizer)
    batch = next(batches)
    assert batches.truncated == 2 and batches.position.index == 2
    assert (batch.segment_ids == 1).all()


GSM8K_PAIRS = [
    {"question": "Natalia sold 48 clips in April and half as many in May. How many in all?",
     "solution": "48/2 = 24 in May, 48+24 = 72.\n#### 72", "source": "gsm8k"},
    {"question": "Weng earns $12 an hour. How much for 50 minutes?", "solution": "12/60*50 = 10\n#### 10",
     "source": "gsm8k"},
]


@pytest.fixture(scope="module")
def chatml(tmp_path_factory):
    out = tmp_path_factory.mktemp("chatml")
    build_chatml_tokenizer(out)
    return AutoTokenizer.from_pretrained(out)


def test_sft_prompt_completion_rows_carry_loss_only_on_the_completion(chatml, tmp_path):
    source = write_jsonl(tmp_path / "pairs.jsonl", GSM8K_PAIRS)
    config = DataConfig(kind="sft", source=str(source), seq_len=256, batch_size=2, shuffle=False,
                        prompt_field="question", completion_field="solution", system_prompt="Be exact.",
                        prompt_template="{prompt}\nAnswer after ####.")
    examples = tokenize_rows(load_rows(str(source)), chatml, config)
    assert len(examples) == 2 and examples.column_names == ["input_ids", "loss_mask"]
    for example, row in zip(examples, GSM8K_PAIRS, strict=True):
        ids, mask = example["input_ids"], example["loss_mask"]
        prefix = (f"<|im_start|>system\nBe exact.<|im_end|>\n<|im_start|>user\n{row['question']}\nAnswer after "
                  f"####.<|im_end|>\n<|im_start|>assistant\n")
        assert chatml.decode(ids) == prefix + row["solution"] + "<|im_end|>\n"
        start = len(chatml.encode(prefix))
        assert chatml.decode(ids[:start]) == prefix
        # the mask is exactly the completion, its <|im_end|> and the newline the template closes it with
        assert mask == [0] * start + [1] * (len(ids) - start)
        assert chatml.decode(ids[start:]) == row["solution"] + "<|im_end|>\n"
        assert sum(mask) == len(row["solution"].encode()) + 2
    # packed: one example per row here, the first token of each is not a target
    batch = next(make_batches(config, chatml))
    for row, (ids, mask) in enumerate(zip(examples["input_ids"], examples["loss_mask"], strict=True)):
        assert batch.input_ids[row, : len(ids)].tolist() == ids
        assert batch.loss_mask[row, : len(ids)].tolist() == [float(m) for m in mask]
        assert (batch.loss_mask[row, len(ids):] == 0).all()


def test_sft_messages_rows_win_over_prompt_completion_columns_and_take_no_template(chatml, tmp_path):
    rows = [{"messages": [{"role": "user", "content": "2+2"}, {"role": "assistant", "content": "4"}],
             "prompt": "unused", "completion": "unused"}]
    source = write_jsonl(tmp_path / "chats.jsonl", rows)
    config = DataConfig(kind="sft", source=str(source), seq_len=64, batch_size=1, system_prompt="unused",
                        prompt_template="Q: {prompt}")
    (example,) = tokenize_rows(load_rows(str(source)), chatml, config)
    assert (example["input_ids"], example["loss_mask"]) == sft_example(chatml, rows[0]["messages"])
    assert chatml.decode(example["input_ids"]) == ("<|im_start|>user\n2+2<|im_end|>\n<|im_start|>assistant\n"
                                                    "4<|im_end|>\n")


def test_sft_rows_with_text_instead_of_messages_are_replayed_documents_with_loss_on_every_token(tokenizer, tmp_path):
    chat = {"messages": [{"role": "user", "content": "12+34"}, {"role": "assistant", "content": "46"}]}
    rows = [chat, {"text": "46-12=34"}, chat]
    source = write_jsonl(tmp_path / "mixed.jsonl", rows)
    config = DataConfig(kind="sft", source=str(source), seq_len=SEQ, batch_size=1, shuffle=False)
    examples = tokenize_rows(load_rows(str(source)), tokenizer, config)
    assert len(examples) == 3
    assert (examples[0]["input_ids"], examples[0]["loss_mask"]) == sft_example(tokenizer, chat["messages"])
    document = [tokenizer.bos_token_id, *tokenizer.encode("46-12=34", add_special_tokens=False),
                tokenizer.eos_token_id]
    assert examples[1]["input_ids"] == document and examples[1]["loss_mask"] == [1] * len(document)
    assert sum(examples[0]["loss_mask"]) < len(examples[0]["input_ids"])  # the chat's prompt stays unmasked
    # a row with neither is refused, as a row without messages always was
    bad = write_jsonl(tmp_path / "bad.jsonl", [chat, {"text": None, "messages": None}])
    with pytest.raises(ValueError, match="messages must be a non-empty list"):
        tokenize_rows(load_rows(str(bad)), tokenizer, config)


def test_sft_rows_of_neither_shape_fail_naming_both(chatml, tmp_path):
    source = write_jsonl(tmp_path / "gsm8k.jsonl", [{"question": "q", "answer": "a"}])
    config = DataConfig(kind="sft", source=str(source), seq_len=64, batch_size=1, prompt_field="question")
    with pytest.raises(ValueError, match=r"'messages' column \(chat messages\) or 'question' and 'completion' "
                                         r"columns \(prompt/completion pairs\); the data has \['question', 'answer'\]"):
        make_batches(config, chatml)


def test_sft_system_prompt_on_a_template_without_a_system_role_fails_clearly(tokenizer, tmp_path):
    source = write_jsonl(tmp_path / "pairs.jsonl", [{"prompt": "1+1", "completion": "2"}])
    config = DataConfig(kind="sft", source=str(source), seq_len=64, batch_size=1, system_prompt="be brief")
    with pytest.raises(ValueError, match=r"cannot render roles \['system', 'user', 'assistant'\]"):
        make_batches(config, tokenizer)
    config = DataConfig(kind="sft", source=str(source), seq_len=64, batch_size=1, prompt_template="{prompt}=")
    (example,) = tokenize_rows(load_rows(str(source)), tokenizer, config)  # without one it is fine
    assert tokenizer.decode(example["input_ids"]) == "<bos><user>1+1=<asst>2<eos>"


def test_a_bad_prompt_template_is_refused():
    with pytest.raises(ValueError, match=r"data\.prompt_template 'Q: \{question\}' must contain the \{prompt\}"):
        DataConfig(kind="sft", source="x.jsonl", seq_len=8, batch_size=1, prompt_template="Q: {question}")


def test_pretrain_packing_streams_documents_across_rows(tokenizer, text_file):
    config = DataConfig(kind="pretrain", source=str(text_file), seq_len=SEQ, batch_size=ROWS, shuffle=False)
    batches = make_batches(config, tokenizer)
    stream = np.concatenate([next(batches).input_ids.ravel() for _ in range(3)])
    bos, eos = tokenizer.bos_token_id, tokenizer.eos_token_id
    expected = np.concatenate([[bos, *tokenizer(r["text"])["input_ids"], eos] for r in addition_texts(40)])
    assert stream.size > expected.size  # into the second epoch (same order: no shuffling)
    # rows are full (no padding) and hold the documents' tokens in order
    np.testing.assert_array_equal(stream, np.tile(expected, 2)[: stream.size])
    assert batches.position.offset > 0 or batches.position.index > 0


def test_pretrain_targets_every_token_but_segment_starts(tokenizer, text_file):
    config = DataConfig(kind="pretrain", source=str(text_file), seq_len=SEQ, batch_size=ROWS, shuffle=False)
    batch = next(make_batches(config, tokenizer))
    starts = np.zeros_like(batch.segment_ids, bool)
    starts[:, 0] = True
    starts[:, 1:] = batch.segment_ids[:, 1:] != batch.segment_ids[:, :-1]
    np.testing.assert_array_equal(batch.loss_mask, (~starts).astype(np.float32))


@pytest.mark.parametrize("kind", ["sft", "pretrain"])
def test_restoring_a_position_continues_exactly(tokenizer, sft_file, text_file, kind):
    source = sft_file if kind == "sft" else text_file
    config = DataConfig(kind=kind, source=str(source), seq_len=SEQ, batch_size=ROWS, seed=7)
    batches = make_batches(config, tokenizer)
    for _ in range(5):  # crosses an epoch boundary (40 short examples)
        next(batches)
    position = DataPosition(**batches.position.model_dump())  # through JSON-able dict
    expected = [next(batches) for _ in range(4)]
    resumed = make_batches(config, tokenizer, position=position)
    for want in expected:
        got = next(resumed)
        for a, b in zip(got, want, strict=True):
            np.testing.assert_array_equal(a, b)
    assert resumed.position == batches.position


def test_epochs_are_reshuffled_and_cover_every_example_once(tokenizer, sft_file):
    config = DataConfig(kind="sft", source=str(sft_file), seq_len=12, batch_size=1, seed=3)
    examples = tokenize_rows(load_rows(str(sft_file)), tokenizer, config)
    assert all(11 <= len(x) <= 12 for x in examples["input_ids"])  # so one example per row
    batches = PackedBatches(examples, seq_len=12, batch_size=1, pad_id=0, split_examples=False,
                            position=DataPosition(seed=3))
    seen = {0: [], 1: []}
    while batches.position.epoch < 2:
        epoch = batches.position.epoch
        seen[epoch] += [tuple(ids) for ids, _ in _examples_in(next(batches))]
    assert sorted(seen[0]) == sorted(seen[1]) == sorted(tuple(x) for x in examples["input_ids"])
    assert seen[0] != seen[1]


def test_local_parquet_and_bad_inputs(tokenizer, tmp_path):
    import datasets

    datasets.Dataset.from_list(addition_texts(5)).to_parquet(str(tmp_path / "t.parquet"))
    assert len(load_rows(str(tmp_path / "t.parquet"))) == 5
    (tmp_path / "t.xyz").write_text("x")
    with pytest.raises(ValueError, match="extension"):
        load_rows(str(tmp_path / "t.xyz"))
    with pytest.raises(ValueError, match="'messages' column"):
        make_batches(DataConfig(kind="sft", source=str(tmp_path / "t.parquet"), seq_len=8, batch_size=1),
                     tokenizer)

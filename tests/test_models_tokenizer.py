"""The offline char and ChatML tokenizers, read back through transformers.AutoTokenizer (the loader vLLM uses)."""

from collections.abc import Callable
from pathlib import Path

import pytest
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from models.tokenizer import (
    ASST_ID,
    BOS_ID,
    CHATML_PAD_ID,
    CHATML_SPECIAL_TOKENS,
    CHATML_VOCAB_SIZE,
    DEFAULT_ALPHABET,
    EOS_ID,
    IM_END_ID,
    IM_START_ID,
    PAD_ID,
    SPECIAL_TOKENS,
    USER_ID,
    build_char_tokenizer,
    build_chatml_tokenizer,
    vocab_size_for,
)


def built_and_loaded(build: Callable[[Path], object], out: Path) -> PreTrainedTokenizerBase:
    """The tokenizer `build` writes into `out`, as transformers loads it."""
    build(out)
    return AutoTokenizer.from_pretrained(out)


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return built_and_loaded(build_char_tokenizer, tmp_path_factory.mktemp("tok"))


def test_vocab_is_specials_then_one_id_per_character(tok):
    assert len(tok) == vocab_size_for() == len(SPECIAL_TOKENS) + len(DEFAULT_ALPHABET) == 48
    assert [tok.convert_tokens_to_ids(s) for s in SPECIAL_TOKENS] == [0, 1, 2, 3, 4]
    assert tok.encode(DEFAULT_ALPHABET) == list(range(5, 5 + len(DEFAULT_ALPHABET)))
    assert (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id) == (PAD_ID, BOS_ID, EOS_ID)
    assert len({PAD_ID, BOS_ID, EOS_ID}) == 3


@pytest.mark.parametrize("text", ["123+456=579", "(7 * 8) - 9 = 47", "hello world", " "])
def test_encode_decode_round_trip(tok, text):
    ids = tok.encode(text)
    assert len(ids) == len(text)  # one token per character, nothing added implicitly
    assert tok.decode(ids) == text


def test_specials_are_single_ids_and_skippable(tok):
    ids = tok.encode("<bos><user>1+2<asst>3<eos>")
    assert ids == [BOS_ID, USER_ID, 6, 15, 7, ASST_ID, 8, EOS_ID]
    assert tok.decode(ids, skip_special_tokens=True) == "1+23"
    assert PAD_ID not in tok.encode(DEFAULT_ALPHABET)  # pad is never a real token


def test_chat_template_output_is_exact(tok):
    chat = [{"role": "user", "content": "12+34"}, {"role": "assistant", "content": "46"},
            {"role": "user", "content": "1+1"}]
    assert tok.apply_chat_template(chat[:2], tokenize=False) == "<bos><user>12+34<asst>46<eos>"
    assert (tok.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
            == "<bos><user>12+34<asst>46<eos><user>1+1<asst>")
    ids = tok.apply_chat_template(chat[:1], add_generation_prompt=True)["input_ids"]
    assert ids == [BOS_ID, USER_ID, 6, 7, 15, 8, 9, ASST_ID]
    with pytest.raises(Exception, match="only user and assistant"):
        tok.apply_chat_template([{"role": "system", "content": "x"}], tokenize=False)


def test_unknown_character_raises_instead_of_mapping_silently(tok):
    with pytest.raises(Exception, match="UNK|unk"):
        tok.encode("ABC")


@pytest.mark.parametrize("family", ["qwen2", "qwen3", "llama3"])
def test_a_tiny_model_dirs_tokenizer_keeps_every_character(tmp_path, family):
    """In a model dir transformers picks the tokenizer class from config.json: for qwen2 it is Qwen2Tokenizer,
    which wraps the vocabulary in GPT-2's byte-level pre-tokenizer and decoder (ignoring tokenizer.json's).
    Each class reads the same ids for every character, spaces included (a plain-spelled vocabulary lost them)."""
    from models.tiny import make_tiny_model

    model_dir = make_tiny_model(tmp_path / family, family=family)
    loaded = AutoTokenizer.from_pretrained(model_dir)
    text = "78 69 60 calc(3 * 4) = 12-x+y"
    ids = loaded.encode(text)
    assert ids == [len(SPECIAL_TOKENS) + DEFAULT_ALPHABET.index(c) for c in text]
    assert loaded.decode(ids) == text
    chat = [{"role": "user", "content": "87-9"}, {"role": "assistant", "content": "78 69"}]
    assert loaded.decode(loaded.apply_chat_template(chat)["input_ids"]) == "<bos><user>87-9<asst>78 69<eos>"


def test_bad_alphabets_are_rejected(tmp_path):
    with pytest.raises(ValueError, match="repeated"):
        build_char_tokenizer(tmp_path, "0120")
    with pytest.raises(ValueError, match="empty"):
        build_char_tokenizer(tmp_path, "")
    assert not list(tmp_path.iterdir())  # nothing written


@pytest.fixture(scope="module")
def chatml(tmp_path_factory):
    return built_and_loaded(build_chatml_tokenizer, tmp_path_factory.mktemp("chatml"))


def test_chatml_vocab_is_the_256_bytes_then_the_specials(chatml):
    assert len(chatml) == CHATML_VOCAB_SIZE == 259
    assert [chatml.convert_tokens_to_ids(s) for s in CHATML_SPECIAL_TOKENS] == [256, 257, 258]
    assert (chatml.pad_token_id, chatml.eos_token_id, chatml.bos_token_id) == (CHATML_PAD_ID, IM_END_ID, None)
    assert chatml.pad_token == "<|endoftext|>" and chatml.eos_token == "<|im_end|>"
    assert (IM_START_ID, IM_END_ID) == (257, 258)


@pytest.mark.parametrize("text", ["Natalia sold 48/2 = <<48/2=24>>24 clips.\n#### 72", "  two  spaces\t",
                                  "ünïcödé — 数学 😀", "{prompt}\r\n", ""])
def test_chatml_encodes_any_text_one_token_per_utf8_byte(chatml, text):
    ids = chatml.encode(text)
    assert ids == list(text.encode())  # nothing added implicitly, token id = byte value
    assert chatml.decode(ids) == text


def test_chatml_template_output_is_exact(chatml):
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "1+1?"},
            {"role": "assistant", "content": "#### 2"}]
    assert chatml.apply_chat_template(chat, tokenize=False) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n1+1?<|im_end|>\n"
        "<|im_start|>assistant\n#### 2<|im_end|>\n")
    ids = chatml.apply_chat_template(chat[:2], add_generation_prompt=True, return_dict=False)
    assert ids == [IM_START_ID, *b"system\nBe brief.", IM_END_ID, 10, IM_START_ID, *b"user\n1+1?", IM_END_ID, 10,
                   IM_START_ID, *b"assistant\n"]
    assert chatml.decode(ids, skip_special_tokens=True) == "system\nBe brief.\nuser\n1+1?\nassistant\n"
    assert chatml.encode("<|im_start|>x<|im_end|>") == [IM_START_ID, ord("x"), IM_END_ID]  # specials are atomic


def test_chatml_vocabulary_can_span_a_real_models(tmp_path):
    """Padded to a model's vocabulary (151,936 for Qwen2.5), every id decodes, text still encodes to
    byte ids only, and the specials keep their ids."""
    build_chatml_tokenizer(tmp_path / "wide", vocab_size=1000)
    wide = AutoTokenizer.from_pretrained(tmp_path / "wide")
    assert len(wide) == 1000
    assert [wide.convert_tokens_to_ids(s) for s in CHATML_SPECIAL_TOKENS] == [256, 257, 258]
    assert wide.decode([259, 999, ord("a")]) == "<x259><x999>a"
    assert wide.encode("<x999> héllo", add_special_tokens=False) == list("<x999> héllo".encode())
    with pytest.raises(ValueError, match="vocab_size"):
        build_chatml_tokenizer(tmp_path / "narrow", vocab_size=CHATML_VOCAB_SIZE - 1)

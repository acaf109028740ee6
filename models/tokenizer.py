"""Offline tokenizers for tiny models (no download), written as standard HF fast-tokenizer dirs, so
`transformers.AutoTokenizer` and vLLM load them like any real checkpoint's tokenizer.

- `build_char_tokenizer`: one token per character of a small alphabet. Ids 0..4 are the special
  tokens, then one id per alphabet character in alphabet order. No BOS is added implicitly: text
  that needs one spells it out (the chat template does).
- `build_chatml_tokenizer`: byte-level (one token per UTF-8 byte, ids 0..255, so any text encodes),
  then `<|endoftext|>` (pad), `<|im_start|>`, `<|im_end|>` (eos) and Qwen's ChatML chat template
  with system, user and assistant roles. No BOS, as Qwen's.
"""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

SPECIAL_TOKENS = ("<pad>", "<bos>", "<eos>", "<user>", "<asst>")
PAD, BOS, EOS, USER, ASST = SPECIAL_TOKENS
PAD_ID, BOS_ID, EOS_ID, USER_ID, ASST_ID = range(len(SPECIAL_TOKENS))
DEFAULT_ALPHABET = "0123456789+-=*() abcdefghijklmnopqrstuvwxyz"

# "<bos><user>{user}<asst>{assistant}<eos>" per exchange; add_generation_prompt appends "<asst>".
CHAT_TEMPLATE = (
    "{{ '" + BOS + "' }}"
    "{% for message in messages %}"
    "{% if message['role'] == 'user' %}{{ '" + USER + "' + message['content'] }}"
    "{% elif message['role'] == 'assistant' %}{{ '" + ASST + "' + message['content'] + '" + EOS + "' }}"
    "{% else %}{{ raise_exception('only user and assistant roles are supported, got ' + message['role']) }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '" + ASST + "' }}{% endif %}"
)


def vocab_size_for(alphabet: str = DEFAULT_ALPHABET) -> int:
    """Number of token ids the tokenizer for `alphabet` uses (specials + one per character)."""
    return len(SPECIAL_TOKENS) + len(alphabet)


def _check_alphabet(alphabet: str) -> None:
    if not alphabet:
        raise ValueError("alphabet must not be empty")
    if len(set(alphabet)) != len(alphabet):
        dupes = sorted({c for c in alphabet if alphabet.count(c) > 1})
        raise ValueError(f"alphabet has repeated characters: {dupes!r}")
    clash = [s for s in SPECIAL_TOKENS if s in alphabet]
    if clash:
        raise ValueError(f"alphabet contains special token text {clash!r}")


def build_char_tokenizer(out_dir: Path, alphabet: str = DEFAULT_ALPHABET) -> None:
    """Write tokenizer.json, tokenizer_config.json and special_tokens_map.json into `out_dir`.

    A character outside the alphabet fails to encode (there is no unknown token on purpose: a
    silent <unk> would corrupt rewards and training data); read as transformers' Qwen2Tokenizer, which
    a qwen2 model dir gets (see below), it is dropped instead, as that class's BPE has no unknown token.
    """
    _check_alphabet(alphabet)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    vocab.update({_byte_level(ch): len(SPECIAL_TOKENS) + i for i, ch in enumerate(alphabet)})

    # WordLevel over single characters: the pre-tokenizer isolates every character and spells it in
    # GPT-2's byte-level symbols (a space is "Ġ"), the ByteLevel decoder joins tokens back without
    # separators. Why byte-level: transformers 5 loads a qwen2 model dir's tokenizer as Qwen2Tokenizer
    # whatever tokenizer_config.json names (qwen2 is in its MODELS_WITH_INCORRECT_HUB_TOKENIZER_CLASS),
    # which keeps the vocabulary but wraps it in the byte-level pre-tokenizer and decoder; a vocabulary
    # spelled in plain characters then had no entry for "Ġ" and every space vanished without an error.
    # Spelled byte-level, both readings give the same ids. unk_token names a token absent from the vocab,
    # so unknown characters raise here instead of mapping to a real id.
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex("."), behavior="isolated"),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in SPECIAL_TOKENS])
    tok.save(str(out_dir / "tokenizer.json"))

    special_map = {"bos_token": BOS, "eos_token": EOS, "pad_token": PAD,
                   "additional_special_tokens": [USER, ASST]}
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        **special_map,
        "chat_template": CHAT_TEMPLATE,
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 1_000_000,
        "padding_side": "right",
    }
    (out_dir / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2))
    (out_dir / "special_tokens_map.json").write_text(json.dumps(special_map, indent=2))


CHATML_SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
CHATML_PAD, IM_START, IM_END = CHATML_SPECIAL_TOKENS
CHATML_PAD_ID, IM_START_ID, IM_END_ID = range(256, 256 + len(CHATML_SPECIAL_TOKENS))
CHATML_VOCAB_SIZE = 256 + len(CHATML_SPECIAL_TOKENS)

# Qwen2.5's template without its default system prompt and tool calls: "<|im_start|>{role}\n{content}
# <|im_end|>\n" per message; add_generation_prompt appends "<|im_start|>assistant\n".
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '" + IM_START + "' + message['role'] + '\n' + message['content'] + '" + IM_END + "' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '" + IM_START + "assistant\n' }}{% endif %}"
)


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte → printable character map, which the ByteLevel pre-tokenizer emits."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    out, extra = {}, 0
    for b in range(256):
        if b in printable:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + extra)
            extra += 1
    return out


def _byte_level(text: str) -> str:
    """`text` in GPT-2's byte-level symbols (what the ByteLevel pre-tokenizer emits): " " -> "Ġ"."""
    symbols = _bytes_to_unicode()
    return "".join(symbols[b] for b in text.encode())


def build_chatml_tokenizer(out_dir: Path, *, model_max_length: int = 32_768,
                           vocab_size: int = CHATML_VOCAB_SIZE) -> None:
    """Write a byte-level tokenizer with Qwen's ChatML specials and chat template into `out_dir`
    (tokenizer.json, tokenizer_config.json, special_tokens_map.json) with `vocab_size` ids.

    Token id = byte value for text (a BPE with no merges over the 256 byte symbols), so every
    string encodes and decodes exactly and a chat's prefixes render as token prefixes. The specials
    follow (256-258); a larger `vocab_size` (a real model's, 151,936 for Qwen2.5) fills the ids after
    them with tokens that text never encodes to and that decode to "<x{id}>", so whatever id a
    random model of that vocabulary samples detokenizes.
    """
    if vocab_size < CHATML_VOCAB_SIZE:
        raise ValueError(f"vocab_size must be >= {CHATML_VOCAB_SIZE}, got {vocab_size}")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    vocab = {symbol: byte for byte, symbol in _bytes_to_unicode().items()}
    vocab.update({token: CHATML_PAD_ID + i for i, token in enumerate(CHATML_SPECIAL_TOKENS)})
    vocab.update({f"<x{i}>": i for i in range(CHATML_VOCAB_SIZE, vocab_size)})
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in CHATML_SPECIAL_TOKENS])
    tok.save(str(out_dir / "tokenizer.json"))

    special_map = {"eos_token": IM_END, "pad_token": CHATML_PAD, "additional_special_tokens": [IM_START]}
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None,
        **special_map,
        "chat_template": CHATML_TEMPLATE,
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": model_max_length,
        "padding_side": "right",
    }
    (out_dir / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2))
    (out_dir / "special_tokens_map.json").write_text(json.dumps(special_map, indent=2))

"""Offline character-level tokenizer for tiny models (one token per character, no download).

Ids 0..4 are the special tokens, then one id per alphabet character in alphabet order.
The files written are a standard HF fast-tokenizer dir, so `transformers.AutoTokenizer` and vLLM
load them like any real checkpoint's tokenizer. No BOS is added implicitly: text that needs one
spells it out (the chat template does).
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
    silent <unk> would corrupt rewards and training data).
    """
    _check_alphabet(alphabet)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    vocab.update({ch: len(SPECIAL_TOKENS) + i for i, ch in enumerate(alphabet)})

    # WordLevel over single characters: the pre-tokenizer isolates every character, the Fuse decoder
    # joins tokens back without separators. unk_token names a token absent from the vocab, so unknown
    # characters raise instead of mapping to a real id.
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
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

"""HMAC-SHA256 tokens written as lowercase hex, checked without raising: the shape shared by the
learner's per-actor credentials (learner/service/credentials.py) and the fleet's enrollment tokens
(tandem_wire/enrollment.py).

Such a token arrives as a gRPC header, which the server decodes from raw HTTP/2 bytes as UTF-8 or
Latin-1, so a presented value may be any text: its shape is checked first (which bounds the work) and
it is compared as bytes (`hmac.compare_digest` raises on non-ASCII text)."""

from __future__ import annotations

import hashlib
import hmac

HEX_MAC_CHARS = 2 * hashlib.sha256().digest_size
_HEX = frozenset("0123456789abcdef")


def hex_mac(key: bytes, text: str) -> str:
    """HMAC-SHA256 of `text` under `key`, as lowercase hex."""
    return hmac.new(key, _as_bytes(text), hashlib.sha256).hexdigest()


def is_lower_hex(text: str) -> bool:
    """Whether `text` is made of lowercase hex digits only."""
    return _HEX.issuperset(text)


def same(presented: str, expected: str) -> bool:
    """Constant-time equality of two texts, compared as bytes."""
    return hmac.compare_digest(_as_bytes(presented), _as_bytes(expected))


def _as_bytes(text: str) -> bytes:
    """`text` as UTF-8; a lone surrogate (which strict UTF-8 refuses) passes through as bytes."""
    return text.encode("utf-8", "surrogatepass")

"""Enrollment tokens: which actor ids the run's fleet started, provable to the learner.

Identity is issued, never claimed: the driver makes a random enrollment key per run and hands it to the
learner and to the fleet (a Ray actor), never to a rollout actor. For each actor it spawns, the fleet
mints `token(key, actor_id)` (HMAC-SHA256, hex) and passes it to that actor alone; the actor presents
it on `Register` (metadata `tandem-enrollment`). Holding the run token is then not enough to register
an id: a token for one id says nothing about any other.

A token arrives as a gRPC header, which the server decodes from raw HTTP/2 bytes as UTF-8 or Latin-1:
`well_formed` accepts only the exact shape `token` makes (64 lowercase hex digits, length checked
first) and `verify` compares bytes, so no presented value makes either raise.
"""

from __future__ import annotations

import secrets

from tandem_wire.hex_mac import HEX_MAC_CHARS, hex_mac, is_lower_hex, same

KEY_BYTES = 32
TOKEN_CHARS = HEX_MAC_CHARS


def new_key() -> bytes:
    """A fresh per-run enrollment key."""
    return secrets.token_bytes(KEY_BYTES)


def token(key: bytes, actor_id: str) -> str:
    """The enrollment token of `actor_id` under `key`."""
    return hex_mac(key, actor_id)


def well_formed(presented: object) -> bool:
    """Whether `presented` has the shape of a token: 64 lowercase hex digits."""
    return isinstance(presented, str) and len(presented) == TOKEN_CHARS and is_lower_hex(presented)


def verify(key: bytes, actor_id: str, presented: object) -> bool:
    """Whether `presented` is `actor_id`'s token under `key`; False, never an exception, for any value."""
    return well_formed(presented) and same(presented, token(key, actor_id))  # type: ignore[arg-type]

"""Per-actor credentials: an HMAC of the actor id and a fresh registration id, keyed by a secret
that never leaves the learner process.

A credential reads `<registration id>.<mac>`. The registration id is random and may appear in logs;
the mac proves that this learner issued it to this actor id, so neither half alone, nor a credential
issued to another actor, passes `verify`. Which registration is current (so which credentials still
work) is the actor registry's business; this module only mints and checks.

A credential arrives as a gRPC header, which the server decodes from raw HTTP/2 bytes as UTF-8 or
Latin-1: any string of any length and characters may be presented. `well_formed` accepts only the
exact shape this module mints (lowercase hex, one dot, fixed length) and `verify` compares bytes, so
no presented value makes either raise (tandem_wire/hex_mac.py, shared with the enrollment tokens).
"""

from __future__ import annotations

import secrets

from tandem_wire.hex_mac import HEX_MAC_CHARS, hex_mac, is_lower_hex, same

REGISTRATION_ID_BYTES = 16
CREDENTIAL_CHARS = 2 * REGISTRATION_ID_BYTES + 1 + HEX_MAC_CHARS


class CredentialMinter:
    """Mints and verifies credentials under one secret key (random per learner process by default)."""

    def __init__(self, key: bytes | None = None) -> None:
        self._key = key or secrets.token_bytes(32)

    def mint(self, actor_id: str) -> tuple[str, str]:
        """(registration id, credential) for a new registration of `actor_id`."""
        registration_id = secrets.token_hex(REGISTRATION_ID_BYTES)
        return registration_id, f"{registration_id}.{self._mac(actor_id, registration_id)}"

    def verify(self, actor_id: str, credential: str) -> bool:
        """Whether this learner minted `credential` for `actor_id`; False, never an exception, for any
        value at all (non-ASCII, over-long, embedded NUL, not a string)."""
        registration_id = registration_id_of(credential)
        if registration_id is None:
            return False
        return same(credential, f"{registration_id}.{self._mac(actor_id, registration_id)}")

    def _mac(self, actor_id: str, registration_id: str) -> str:
        return hex_mac(self._key, f"{actor_id}\n{registration_id}")


def well_formed(credential: object) -> bool:
    """Whether `credential` has the shape of a minted one: `<32 hex>.<64 hex>`, lowercase. Checks the
    length first, so an over-long value costs nothing."""
    if not isinstance(credential, str) or len(credential) != CREDENTIAL_CHARS:
        return False
    registration_id, dot, mac = credential.partition(".")
    return (dot == "." and len(registration_id) == 2 * REGISTRATION_ID_BYTES
            and is_lower_hex(registration_id) and is_lower_hex(mac))


def registration_id_of(credential: object) -> str | None:
    """The registration id a well-formed credential names, else None."""
    return credential.partition(".")[0] if well_formed(credential) else None  # type: ignore[union-attr]

"""Per-actor credentials: an HMAC of the actor id and a fresh registration id, keyed by a secret
that never leaves the learner process.

A credential reads `<registration id>.<mac>`. The registration id is random and may appear in logs;
the mac proves that this learner issued it to this actor id, so neither half alone, nor a credential
issued to another actor, passes `verify`. Which registration is current (so which credentials still
work) is the actor registry's business; this module only mints and checks.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

REGISTRATION_ID_BYTES = 16
CREDENTIAL_CHARS = 2 * REGISTRATION_ID_BYTES + 1 + 2 * hashlib.sha256().digest_size


class CredentialMinter:
    """Mints and verifies credentials under one secret key (random per learner process by default)."""

    def __init__(self, key: bytes | None = None) -> None:
        self._key = key or secrets.token_bytes(32)

    def mint(self, actor_id: str) -> tuple[str, str]:
        """(registration id, credential) for a new registration of `actor_id`."""
        registration_id = secrets.token_hex(REGISTRATION_ID_BYTES)
        return registration_id, f"{registration_id}.{self._mac(actor_id, registration_id)}"

    def verify(self, actor_id: str, credential: str) -> bool:
        """Whether this learner minted `credential` for `actor_id`."""
        registration_id = registration_id_of(credential)
        if registration_id is None:
            return False
        return hmac.compare_digest(credential, f"{registration_id}.{self._mac(actor_id, registration_id)}")

    def _mac(self, actor_id: str, registration_id: str) -> str:
        message = f"{actor_id}\n{registration_id}".encode()
        return hmac.new(self._key, message, hashlib.sha256).hexdigest()


def registration_id_of(credential: str) -> str | None:
    """The registration id a well-formed credential names, else None."""
    if len(credential) != CREDENTIAL_CHARS:
        return None
    registration_id, dot, _ = credential.partition(".")
    return registration_id if dot and len(registration_id) == 2 * REGISTRATION_ID_BYTES else None

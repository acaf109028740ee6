"""Digests of a weight version's blob, named on the wire (WeightHeader.checksum_algorithm).

The learner picks the kind (`server.weight_digest`); the actor verifies with the kind the header
names and refuses a kind it does not know. BLAKE3 (the `blake3` package, which vLLM depends on
too) is the default: it hashes in parallel over its own tree of chunks and releases the GIL, at
memory speed where hashlib's sha256 is the bottleneck of a push. sha256 stays for operators who
want a FIPS hash.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Protocol

import blake3


class Digest(Protocol):
    def update(self, data: memoryview | bytes, /) -> object: ...
    def hexdigest(self) -> str: ...


# The learner hashes its blob in one call; the actor hashes each received chunk as it lands. Both use
# every core BLAKE3's threads can get (max_threads=AUTO splits one large update over a thread pool).
DIGESTS: dict[str, Callable[[], Digest]] = {
    "blake3": lambda: blake3.blake3(max_threads=blake3.blake3.AUTO),
    "sha256": hashlib.sha256,
}
DEFAULT_DIGEST = "blake3"


class UnknownDigest(ValueError):
    """A digest kind this side does not implement."""


def new_digest(kind: str) -> Digest:
    """A fresh hasher of `kind` (UnknownDigest if it is not one of DIGESTS)."""
    factory = DIGESTS.get(kind)
    if factory is None:
        raise UnknownDigest(f"unsupported checksum algorithm {kind!r}; known: {sorted(DIGESTS)}")
    return factory()


def hexdigest(kind: str, data: memoryview | bytes) -> str:
    """The `kind` digest of `data`, in hex."""
    digest = new_digest(kind)
    digest.update(data)
    return digest.hexdigest()

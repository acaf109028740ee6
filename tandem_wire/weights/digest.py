"""Digests of a weight version's blob, named on the wire (WeightHeader.checksum_algorithm).

The learner picks the kind (`server.weight_digest`); the actor verifies with the kind the header
names and refuses a kind it does not know. BLAKE3 (the `blake3` package, which vLLM depends on
too) is the default: it hashes in parallel over its own tree of chunks and releases the GIL, at
memory speed where hashlib's sha256 is the bottleneck of a push. sha256 stays for operators who
want a FIPS hash.

A same-host shared file is verified with its own kind, named in its SharedWeights: xxh3_128 by
default (`server.shared_weight_digest`). That check is against accidental damage only (a torn or
stale file): a process that could forge the file could write the actor's memory as well, so a
cryptographic hash buys nothing there, and xxh3 runs on one core at memory speed (measured 0.12 s
per GiB, BLAKE3 0.21 s on both cores), leaving the other core to scan the values meanwhile. Bytes
that another actor relays are a different matter: a stream's header must name a CRYPTOGRAPHIC kind.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Protocol

import blake3
import xxhash


class Digest(Protocol):
    def update(self, data: memoryview | bytes, /) -> object: ...
    def hexdigest(self) -> str: ...


# The learner hashes its blob in one call; the actor hashes each received chunk as it lands. Both use
# every core BLAKE3's threads can get (max_threads=AUTO splits one large update over a thread pool).
DIGESTS: dict[str, Callable[[], Digest]] = {
    "blake3": lambda: blake3.blake3(max_threads=blake3.blake3.AUTO),
    "sha256": hashlib.sha256,
    "xxh3_128": xxhash.xxh3_128,
}
CRYPTOGRAPHIC = frozenset({"blake3", "sha256"})  # kinds a stream (maybe relayed by another actor) may name
DEFAULT_DIGEST = "blake3"
DEFAULT_SHARED_DIGEST = "xxh3_128"


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

"""Broken weight versions for fault tests: damage a packed version on every path an actor may take
(the chunk stream and, when the learner shares it, the shared-memory file), so that the actor's
fallback from one path to the other cannot hide the fault."""

from __future__ import annotations

import dataclasses
import os

from learner.weights.publisher import WeightBlob
from tandem_wire import pb


def flip_a_byte(blob: WeightBlob) -> WeightBlob:
    """The version with one payload byte flipped after its digest was taken."""
    chunk = bytearray(blob.messages[1])
    chunk[len(chunk) // 2] ^= 0xFF
    if "shared" in blob.extra:
        path = pb.WeightMessage.FromString(blob.extra["shared"][1]).shared.path
        os.chmod(path, 0o600)
        with open(path, "r+b") as f:
            first = f.read(1)
            f.seek(0)
            f.write(bytes([first[0] ^ 0xFF]))
    return dataclasses.replace(blob, messages=(blob.messages[0], bytes(chunk), *blob.messages[2:]))


def cut_before_commit(blob: WeightBlob) -> WeightBlob:
    """The version whose streams end before their commit (a connection dropped mid-push)."""
    extra = {name: messages[:-1] for name, messages in blob.extra.items()}
    return dataclasses.replace(blob, messages=blob.messages[:-1], extra=extra)


def damaging(real_pack, damage: dict[int, object]):
    """`real_pack` (learner.weights.publisher.pack_weights) with `damage[version](blob)` applied to
    the versions named, for monkeypatching learner.weights.desk.pack_weights."""
    def pack(version, *args, **kwargs):
        blob = real_pack(version, *args, **kwargs)
        return damage[version](blob) if version in damage else blob
    return pack

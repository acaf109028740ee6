"""The shared-memory transport's actor half (tandem_wire/weights/transports.py): the file the learner
names in a SharedWeights, mapped copy-on-write (MAP_PRIVATE) as the version's blob, with no copy. The
learner writes each file once under a fresh name and never changes it, so what staging verifies in place
is what vLLM reads. (Only a process of the same user on the same host could still write the file; such a
process can write this actor's memory as well, so a private copy would buy nothing against it.)
Measured: a copy halved the shared path's rate."""

from __future__ import annotations

import mmap
import os
import stat
from pathlib import Path

import numpy as np

from actors.weights.halves import ActorHalf
from actors.weights.staged import AnswerSuperseded, StagingWatcher, WeightTransferError
from tandem_wire import pb
from tandem_wire.weights.shared_memory import SHARED_PREFIX, SHM_DIR, shared_memory_domain


class SharedFileGone(AnswerSuperseded):
    """The shared file the learner named no longer exists: the learner finishes its (3-message) stream
    and unpins the version before we open the file, and a publish in between removes it."""


def map_shared(shared: pb.SharedWeights, header: pb.WeightHeader) -> np.ndarray:
    """The shared file mapped copy-on-write, as bytes. Only a regular file under the shared-memory
    dir, of exactly the announced size."""
    path = Path(shared.path)
    if shared.version != header.version or shared.total_bytes != header.total_bytes:
        raise WeightTransferError(f"shared weights of version {shared.version}, {shared.total_bytes} bytes "
                                  f"in a stream of version {header.version}, {header.total_bytes} bytes")
    if path.parent != SHM_DIR or not path.name.startswith(SHARED_PREFIX):
        raise WeightTransferError(f"shared weights outside {SHM_DIR}: {shared.path!r}")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError as error:
        raise SharedFileGone(f"shared weights gone (superseded?): {error}") from None
    except OSError as error:
        raise WeightTransferError(f"shared weights unreadable: {error}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size != header.total_bytes:
            raise WeightTransferError(f"shared weights {path.name}: not a file of {header.total_bytes} bytes")
        if not header.total_bytes:
            return np.empty(0, dtype=np.uint8)
        # ACCESS_COPY (MAP_PRIVATE): writable views for torch.from_numpy, and no write ever reaches the file
        return np.frombuffer(mmap.mmap(fd, header.total_bytes, access=mmap.ACCESS_COPY), dtype=np.uint8)
    finally:
        os.close(fd)  # the mapping outlives the descriptor


class SharedMemoryHalf(ActorHalf):
    """Offers this host's shared-memory domain; staging maps the file the answer names."""

    shared_files = True

    def __init__(self, domain: str) -> None:
        self.domain = domain

    def prepare(self, request: pb.FetchWeightsRequest, offered: bool) -> StagingWatcher | None:
        if offered:
            request.shared_memory_domain = self.domain
        return None


def actor_half(*, shared_memory: bool = False, **_: object) -> SharedMemoryHalf | None:
    """The half, when the client offers shared memory and this host has some to share."""
    domain = shared_memory_domain() if shared_memory else ""
    return SharedMemoryHalf(domain) if domain else None

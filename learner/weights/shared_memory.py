"""The shared-memory transport's learner half (tandem_wire/weights/transports.py): one /dev/shm file per
weight version, for actors on the learner's host (the bulk path).

The learner writes a version's blob once into /dev/shm; every same-host actor copies it from there,
so the learner's outbound bytes per version stay one version however many actors read it. A file is
named after the learner's pid and a random token of this process, so a new learner never reuses a
dead one's name and an actor only ever opens the path the live learner names (and verifies what it
read against the live learner's digest). Files are made read-only once written, removed when their
version is dropped and at close; files left by a learner that died (its pid gone) are removed at start.

Plain files in a tmpfs rather than multiprocessing.shared_memory: the latter registers each segment
with a resource tracker process that unlinks it when *any* attaching process exits, and names carry
no owner to sweep by.

A fetch that offers this transport from the learner's own shared-memory domain is answered with a second,
tiny stream (header, SharedWeights, commit); the SharedWeights carries the file's own digest (xxh3_128 by
default: tandem_wire.weights.digest says why). A version whose file could not be written (e.g. /dev/shm
is full) is streamed.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
import secrets
from pathlib import Path
from typing import TYPE_CHECKING

from learner.weights.halves import Count, Fetch, LearnerHalf, Messages
from learner.weights.publisher import WeightBlob
from learner.wire_bounds import check_text
from tandem_wire import pb
from tandem_wire.limits import MAX_LABEL_CHARS
from tandem_wire.weights.digest import hexdigest
from tandem_wire.weights.shared_memory import SHARED_PREFIX, SHM_DIR, remove_orphans, shared_memory_domain
from tandem_wire.weights.transports import SHARED_MEMORY

if TYPE_CHECKING:
    from learner.schema import ServiceConfig

log = logging.getLogger(__name__)
STALE_NAME = re.compile(re.escape(SHARED_PREFIX) + r"(\d+)-[0-9a-f]+-v\d+")


class SharedWeightFiles:
    """Writes, names and removes this learner's shared weight files. Thread-compatible: the service
    calls it under its own lock."""

    def __init__(self, directory: Path = SHM_DIR) -> None:
        self.directory = directory
        self.domain = shared_memory_domain(directory)
        self._prefix = f"{SHARED_PREFIX}{os.getpid()}-{secrets.token_hex(8)}-v"
        self._paths: dict[int, Path] = {}
        remove_stale_files(directory)

    def write(self, version: int, blob: memoryview) -> str:
        """Write `blob` as `version`'s file (read-only once written); returns its path."""
        path = self.directory / f"{self._prefix}{version}"
        try:
            with open(path, "xb", opener=lambda name, flags: os.open(name, flags, 0o600)) as f:
                f.write(blob)
                os.fchmod(f.fileno(), 0o400)
        except BaseException:
            path.unlink(missing_ok=True)
            raise
        self._paths[version] = path
        return str(path)

    def remove(self, version: int) -> None:
        """Remove `version`'s file (an actor that opened it keeps reading its copy of the inode)."""
        path = self._paths.pop(version, None)
        if path is not None:
            path.unlink(missing_ok=True)

    def close(self) -> None:
        for version in list(self._paths):
            self.remove(version)


def remove_stale_files(directory: Path) -> list[Path]:
    """Remove the shared weight files of learners that no longer run; returns what was removed."""
    removed = remove_orphans(directory, STALE_NAME)
    if removed:
        log.info("removed %d shared weight file(s) of dead learners from %s", len(removed), directory)
    return removed


class SharedMemoryHalf(LearnerHalf):
    """Writes each version's file as it is packed, answers same-host fetches with it, removes it with its
    version."""

    def __init__(self, files: SharedWeightFiles, digest: str, count: Count) -> None:
        self._files, self._digest, self._count = files, digest, count

    def check(self, request: pb.FetchWeightsRequest) -> None:
        check_text("shared_memory_domain", request.shared_memory_domain, MAX_LABEL_CHARS)

    def packed(self, weights: WeightBlob, blob: memoryview) -> WeightBlob:
        try:
            path = self._files.write(weights.version, blob)
        except OSError as error:
            log.warning("weight version %d not shared (actors on this host stream it): %s", weights.version, error)
            return weights
        same = self._digest == weights.header.checksum_algorithm
        location = pb.SharedWeights(version=weights.version, path=path, total_bytes=len(blob),
                                    checksum_algorithm=self._digest,
                                    checksum=weights.checksum if same else hexdigest(self._digest, blob))
        messages = (weights.messages[0], pb.WeightMessage(shared=location).SerializeToString(), weights.messages[-1])
        return dataclasses.replace(weights, extra={**weights.extra, SHARED_MEMORY.source: messages})

    def published(self, weights: WeightBlob) -> None:
        if SHARED_MEMORY.source in weights.extra:
            self._count("weight_bytes_shared", weights.header.total_bytes)

    def answer(self, weights: WeightBlob, fetch: Fetch) -> Messages | None:
        if SHARED_MEMORY.source in fetch.offers and fetch.request.shared_memory_domain == self._files.domain:
            return weights.extra.get(SHARED_MEMORY.source)  # None: this version has no file
        return None

    def dropped(self, version: int) -> None:
        self._files.remove(version)

    def close(self) -> None:
        self._files.close()


def learner_half(config: ServiceConfig, count: Count) -> SharedMemoryHalf | None:
    """The half, unless the config switches it off or this host has no shared memory to offer."""
    if not config.server.weight_shared_memory:
        return None
    files = SharedWeightFiles()
    return SharedMemoryHalf(files, config.server.shared_weight_digest, count) if files.domain else None

"""One shared-memory file per weight version, for actors on the learner's host (the bulk path).

The learner writes a version's blob once into /dev/shm; every same-host actor copies it from there,
so the learner's outbound bytes per version stay one version however many actors read it. A file is
named after the learner's pid and a random token of this process, so a new learner never reuses a
dead one's name and an actor only ever opens the path the live learner names (and verifies what it
read against the live learner's digest). Files are made read-only once written, removed when their
version is dropped and at close; files left by a learner that died (its pid gone) are removed at start.

Plain files in a tmpfs rather than multiprocessing.shared_memory: the latter registers each segment
with a resource tracker process that unlinks it when *any* attaching process exits, and names carry
no owner to sweep by.
"""

from __future__ import annotations

import logging
import os
import re
import secrets
from pathlib import Path

from tandem_wire.weights.shared_memory import SHARED_PREFIX, SHM_DIR, remove_orphans, shared_memory_domain

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

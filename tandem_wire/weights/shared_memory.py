"""Where the learner and an actor can share a weight blob through memory, how it is named, and how what
dead processes left there is swept.

Two processes share /dev/shm when they run under one kernel *and* see the same tmpfs mount (two
containers of one host have the same boot id but separate /dev/shm mounts). The domain string says
both, so a learner offers a shared file only to an actor that can open it; an actor whose open still
fails falls back to the gRPC stream. What tandem puts in /dev/shm (a learner's version files, an actor's
adapter dirs) is named after its process's pid, so the next process of its kind removes what a killed
one left (`remove_orphans`): memory a tmpfs would otherwise hold until the host reboots.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import psutil

SHM_DIR = Path("/dev/shm")
SHARED_PREFIX = "tandem-weights-"  # + "<learner pid>-<random>-v<version>"


def shared_memory_domain(directory: Path = SHM_DIR) -> str:
    """"<boot id>:<device>:<inode>" of `directory`; "" where there is no shared memory to offer."""
    try:
        boot_id = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        stat = os.stat(directory)
    except OSError:
        return ""
    return f"{boot_id}:{stat.st_dev}:{stat.st_ino}"


def remove_orphans(directory: Path, owned: re.Pattern[str]) -> list[Path]:
    """Remove the entries of `directory` (files, or dirs with what they hold) whose whole name matches
    `owned` with the owner's pid as its first group, when that pid no longer runs; returns them."""
    removed = []
    for path in directory.iterdir():
        match = owned.fullmatch(path.name)
        if match and not psutil.pid_exists(int(match.group(1))):
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
            removed.append(path)
    return removed

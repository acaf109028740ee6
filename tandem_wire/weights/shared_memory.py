"""Where the learner and an actor can share a weight blob through memory, and how it is named.

Two processes share /dev/shm when they run under one kernel *and* see the same tmpfs mount (two
containers of one host have the same boot id but separate /dev/shm mounts). The domain string says
both, so a learner offers a shared file only to an actor that can open it; an actor whose open still
fails falls back to the gRPC stream.
"""

from __future__ import annotations

import os
from pathlib import Path

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

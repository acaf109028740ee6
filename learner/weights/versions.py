"""Which weight versions an actor may name: those this learner published, and the restored one; and
what version 0 may be.

Reports of any other version (never published, negative, from the future) are refused, so that
actors_status() and the version-lag metrics only ever show versions that exist. Published versions
increase, so they are kept in a compact sorted array (8 bytes each) and looked up by bisection.

Version 0 is the run's initial checkpoint, which every actor starts from and so never fetches. A run
that publishes LoRA adapters may publish its initial adapter as version 0 only if it changes nothing
(every lora_B zero, as LoRA initialises it): otherwise actors at version 0 would sample another policy
than the one the learner scores their groups with.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left
from collections.abc import Iterable

import numpy as np

from learner.wire_bounds import InvalidInput

NO_VERSION = -1  # an actor that serves no weights this learner knows
INITIAL_VERSION = 0  # the run's initial checkpoint, which every actor starts from


LORA_B_SUFFIX = ".lora_B.weight"  # PEFT's name of an adapter's up-projection (models/peft.py)


def check_initial_adapter(tensors: Iterable[tuple[str, np.ndarray]]) -> None:
    """Raise ValueError unless these adapters are the zero update (every lora_B all zeros), which is
    what version 0, the base the actors start from, must be."""
    nonzero = [name for name, tensor in tensors if name.endswith(LORA_B_SUFFIX) and np.any(np.asarray(tensor))]
    if nonzero:
        raise ValueError(f"version {INITIAL_VERSION} is the base every actor starts from and never fetches: an "
                         f"adapter published as it must change nothing, but {len(nonzero)} lora_B tensor(s) are "
                         f"not zero ({nonzero[:3]})")


class UnknownWeightVersion(InvalidInput):
    """A weight report naming a version this learner never published."""


class WeightVersions:
    """The published versions (strictly increasing) and the version restored from a checkpoint."""

    def __init__(self) -> None:
        self._published = array("q")
        self._restored: int | None = None

    def published(self, version: int) -> None:
        if self._published and version <= self._published[-1]:
            raise ValueError(f"version {version} is not newer than {self._published[-1]}")
        self._published.append(version)

    def restored(self, version: int) -> None:
        self._restored = version

    def __contains__(self, version: int) -> bool:
        """Whether `version` was published here or is the restored one."""
        i = bisect_left(self._published, version)
        return version == self._restored or (i < len(self._published) and self._published[i] == version)

    def check_reported(self, version: int) -> int:
        """`version` if an actor may report on it; raises UnknownWeightVersion otherwise."""
        if version not in self:
            raise UnknownWeightVersion(f"weight version {version} was never published by this learner")
        return version

    def served(self, version: int) -> int:
        """What to record for an actor that says it serves `version`: the version if it is known (or
        the initial one), else NO_VERSION."""
        return version if version == INITIAL_VERSION or version in self else NO_VERSION

"""Which weight versions an actor may name: those this learner published, and the restored one.

Reports of any other version (never published, negative, from the future) are refused, so that
actors_status() and the version-lag metrics only ever show versions that exist. Published versions
increase, so they are kept in a compact sorted array (8 bytes each) and looked up by bisection.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left

from learner.wire_bounds import InvalidInput

NO_VERSION = -1  # an actor that serves no weights this learner knows
INITIAL_VERSION = 0  # the run's initial checkpoint, which every actor starts from


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

"""Checks of single wire fields against their documented bounds (tandem_wire/limits.py).

Each raises InvalidInput with a detail that names the field and the bound, and never echoes more
than a short prefix of the offending value, so that a hostile value cannot grow a log line or an ack.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from tandem_wire import WIRE_VERSION
from tandem_wire.limits import MAX_METADATA_ENTRIES, MAX_METADATA_KEY_CHARS, MAX_METADATA_VALUE_CHARS

SHOWN_CHARS = 32  # how much of a refused value a detail quotes


class InvalidInput(ValueError):
    """A message field outside its bounds or rules; the message is the detail sent back."""


def check_wire_version(version: int) -> None:
    """Refuse a message of another wire version, saying which side is behind: an actor of wire version 1
    sends no per-token versions (Completion.token_versions), so its groups could not be trained exactly."""
    if version == WIRE_VERSION:
        return
    if 0 < version < WIRE_VERSION:
        raise InvalidInput(f"wire_version {version} is older than this learner's {WIRE_VERSION}: update the actor "
                           "(since wire version 2 every completion carries the weight version of each token)")
    raise InvalidInput(f"unsupported wire_version {version} (this learner speaks {WIRE_VERSION})")


def shown(value: str) -> str:
    """A refused value as a detail quotes it: its repr, cut to SHOWN_CHARS characters."""
    return repr(value[:SHOWN_CHARS]) + ("..." if len(value) > SHOWN_CHARS else "")


def check_text(what: str, value: str, max_chars: int, *, printable: bool = False,
               required: bool = False) -> str:
    """`value` if it has at most `max_chars` characters (and, if asked, is non-empty and printable)."""
    if required and not value:
        raise InvalidInput(f"empty {what}")
    if len(value) > max_chars:
        raise InvalidInput(f"{what} has {len(value)} characters > {max_chars}")
    if printable and not value.isprintable():
        raise InvalidInput(f"{what} {shown(value)} has non-printable characters")
    return value


def check_int(what: str, value: int, low: int, high: int | None = None) -> int:
    """`value` if low <= value (<= high)."""
    if value < low or (high is not None and value > high):
        bound = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise InvalidInput(f"{what} {value} is not {bound}")
    return value


def check_nonnegative(what: str, value: float) -> float:
    """`value` if it is a finite, non-negative number (a duration, a unix time, a rate)."""
    if not math.isfinite(value) or value < 0:
        raise InvalidInput(f"{what} {value} is not a finite number >= 0")
    return value


def check_fraction(what: str, value: float) -> float:
    """`value` if it is a finite number in [0, 1] (a share of wall time)."""
    if not math.isfinite(value) or not 0 <= value <= 1:
        raise InvalidInput(f"{what} {value} is not a fraction in [0, 1]")
    return value


def check_metadata(metadata: Mapping[str, str]) -> dict[str, str]:
    """The metadata as a dict, if its entry count, keys and values are within bounds."""
    if len(metadata) > MAX_METADATA_ENTRIES:
        raise InvalidInput(f"metadata has {len(metadata)} entries > {MAX_METADATA_ENTRIES}")
    out = dict(metadata)
    for key, value in out.items():
        check_text("metadata key", key, MAX_METADATA_KEY_CHARS)
        check_text(f"metadata value of {shown(key)}", value, MAX_METADATA_VALUE_CHARS)
    return out

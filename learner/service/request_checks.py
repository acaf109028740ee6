"""The bounds every call other than StreamGroups must satisfy (tandem_wire/limits.py), checked at the
learner's door before anything is stored: each function returns the clean values or raises
InvalidInput, which the servicer answers INVALID_ARGUMENT."""

from __future__ import annotations

from typing import Any

from learner.service.actor_registry import Capabilities, TimeShares
from learner.weights.versions import NO_VERSION
from learner.wire_bounds import (
    InvalidInput,
    check_fraction,
    check_int,
    check_nonnegative,
    check_text,
    check_wire_version,
)
from tandem_wire import pb
from tandem_wire.limits import (
    MAX_DETAIL_CHARS,
    MAX_GROUP_SIZE,
    MAX_GROUPS_IN_FLIGHT,
    MAX_ID_CHARS,
    MAX_LABEL_CHARS,
    MAX_MODEL_LEN,
)

SHARES_SLACK = 1e-6  # rounding the actor's four divisions may add


def caller(request: Any) -> str:
    """The actor id of a request that carries a wire version and an actor id."""
    check_wire_version(request.wire_version)
    return actor_id(request.actor_id)


def actor_id(value: str) -> str:
    return check_text("actor_id", value, MAX_ID_CHARS, printable=True, required=True)


def capabilities(c: pb.ActorCapabilities) -> Capabilities:
    max_model_len = check_int("max_model_len", c.max_model_len, 2, MAX_MODEL_LEN)
    return Capabilities(
        engine=check_text("engine", c.engine, MAX_LABEL_CHARS, printable=True),
        model_family=check_text("model_family", c.model_family, MAX_LABEL_CHARS, printable=True),
        max_model_len=max_model_len,
        group_size=check_int("group_size", c.group_size, 1, MAX_GROUP_SIZE),
        host=check_text("host", c.host, MAX_LABEL_CHARS, printable=True),
        max_prompt_tokens=check_int("max_prompt_tokens", c.max_prompt_tokens, 0, max_model_len - 1),
    )


def served_version(version: int) -> int:
    """A version an actor says it serves (NO_VERSION = none)."""
    return check_int("weight_version", version, NO_VERSION)


def heartbeat(request: pb.HeartbeatRequest) -> tuple[int, int, float, TimeShares]:
    """(weight_version, groups_in_flight, tokens_per_second, time_shares) of a heartbeat."""
    return (served_version(request.weight_version),
            check_int("groups_in_flight", request.groups_in_flight, 0, MAX_GROUPS_IN_FLIGHT),
            check_nonnegative("tokens_per_second", request.tokens_per_second),
            time_shares(request.time_shares))


def time_shares(shares: pb.TimeShares) -> TimeShares:
    """Shares of one interval's wall time: each in [0, 1], and together at most the whole of it."""
    checked = TimeShares(**{field: check_fraction(f"time_shares.{field}", getattr(shares, field))
                            for field in ("busy", "lease_wait", "credit_wait", "weight_stall")})
    total = checked.busy + checked.lease_wait + checked.credit_wait + checked.weight_stall
    if total > 1 + SHARES_SLACK:
        raise InvalidInput(f"time_shares add up to {total:.6g} > 1")
    return checked


def weight_report(request: pb.WeightReport) -> dict[str, Any]:
    """The report as actors_status() shows it (its version is checked against the published ones
    by the caller)."""
    return {
        "version": request.version,
        "applied": request.applied,
        "detail": check_text("detail", request.detail, MAX_DETAIL_CHARS),
        "stall_seconds": check_nonnegative("stall_seconds", request.stall_seconds),
        "transfer_seconds": check_nonnegative("transfer_seconds", request.transfer_seconds),
    }

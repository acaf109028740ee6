"""The learner's door for actor ids: `Register` needs the enrollment token the run's fleet minted for
the id (tandem_wire/enrollment.py), so a holder of the run token cannot invent ids; and an id the fleet
retired (it replaced or removed that actor) is refused for good, token or not.

`server.open_enrollment` lets any id register without a token (actors started outside Ray, which no
fleet enrolls); retired ids are refused even then. Not thread-safe: the service calls it under its lock.
"""

from __future__ import annotations

from collections.abc import Iterable

from learner.service.actor_registry import CredentialRefused, MalformedCredential
from tandem_wire import enrollment


class NotEnrolled(CredentialRefused):
    """`Register` of an id without its enrollment token, or of a retired id (PERMISSION_DENIED)."""


class EnrollmentGate:
    """Checks each `Register` against the run's enrollment key (random when none is given: then only
    `open_enrollment` admits anyone) and the ids the fleet retired."""

    def __init__(self, key: bytes | None, open_enrollment: bool) -> None:
        self._key = key or enrollment.new_key()
        self._open = open_enrollment
        self._retired: set[str] = set()

    def admit(self, actor_id: str, presented: str | None) -> None:
        """Raises MalformedCredential for a token of the wrong shape (any header value at all may be
        presented), NotEnrolled for a retired id or, unless enrollment is open, a missing or wrong token."""
        if presented and not enrollment.well_formed(presented):
            raise MalformedCredential(actor_id, header="enrollment")
        if actor_id in self._retired:
            raise NotEnrolled(f"actor {actor_id!r} was retired: the fleet replaced or removed it")
        if not self._open and not enrollment.verify(self._key, actor_id, presented):
            raise NotEnrolled(f"actor {actor_id!r} is not enrolled: Register needs the enrollment token the "
                              f"run's fleet gave it (or server.open_enrollment)")

    def vouches(self, actor_id: str, presented: str | None) -> bool:
        """Whether `presented` is `actor_id`'s enrollment token: one HMAC over bounded input, constant-time,
        never raising, and reading only the key, so it is safe without the service's lock (the servicer
        asks before a Register takes a slot of that id). Says nothing about retirement or open enrollment."""
        return enrollment.verify(self._key, actor_id, presented)

    def retire(self, actor_ids: Iterable[str]) -> list[str]:
        """Refuse `actor_ids` from now on; returns those not retired before."""
        new = sorted(set(actor_ids) - self._retired)
        self._retired.update(new)
        return new

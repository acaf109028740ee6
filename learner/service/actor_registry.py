"""The learner's table of registered actors: who they are, what they declared, what they report.

Each registration gets its own credential (learner/service/credentials.py). An actor that registers again
presenting its current credential renews it: same *incarnation*, so the prompts leased to it stay
its own. A registration without it (a restarted actor process, or someone else claiming the id)
starts a new incarnation and supersedes the old one: the old credential is refused from then on
(Superseded), and the old incarnation's leases are answerable by nobody until they expire.

The table is bounded (`max_actors`; actors silent for `actor_timeout_s` are evicted to make room).
Not thread-safe: the service calls it under its own lock.
"""

from __future__ import annotations

import dataclasses
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from learner.service.credentials import CredentialMinter, registration_id_of, well_formed

SUPERSEDED_KEPT = 4  # superseded registrations remembered per actor (answered Superseded, not unknown)


class CredentialRefused(Exception):
    """A call whose credential does not entitle it to act as the actor it names."""


class UnknownCredential(CredentialRefused):
    """No credential, or one this learner does not know (restarted learner, evicted actor): register."""


MALFORMED_ADVICE = {  # what a client that sent a malformed header should do instead
    "credential": "malformed credential: register without one, or with the one you were given",
    "enrollment": "malformed enrollment token: present the token the run's fleet minted for this actor id",
}


class MalformedCredential(UnknownCredential):
    """A credential header (or, `header="enrollment"`, an enrollment header) no learner or fleet could
    have minted (non-ASCII, over-long, wrong shape): a broken or hostile client. `actor_id` is the id
    the call claimed ("" when it names none)."""

    def __init__(self, actor_id: str, header: str = "credential") -> None:
        super().__init__(MALFORMED_ADVICE[header])
        self.actor_id = actor_id
        self.header = header


class Superseded(CredentialRefused):
    """The credential's registration was replaced by a newer one of the same actor id."""


class WrongActor(CredentialRefused):
    """A valid credential used to act as another actor."""


class RegistryFull(Exception):
    """max_actors live actors are registered."""


@dataclass(frozen=True)
class Capabilities:
    """What an actor declared at registration (bounds checked by learner/service/request_checks.py)."""

    engine: str
    model_family: str
    max_model_len: int
    group_size: int
    host: str
    max_prompt_tokens: int = 0  # 0 = not declared


@dataclass(frozen=True)
class TimeShares:
    """Where an actor's wall time went over its last heartbeat interval (pb.TimeShares): fractions of
    it sampling, waiting for the lease budget, blocked on credits, stalled by a weight load."""

    busy: float = 0.0
    lease_wait: float = 0.0
    credit_wait: float = 0.0
    weight_stall: float = 0.0


@dataclass
class ActorRecord:
    """What the learner knows of one actor: its registration and what it last reported. The learner's
    one type for an actor's state (pb.ActorStatus carries it on the wire); actors_status() hands out
    copies. `holder` names its incarnation as the lease holder of its prompts."""

    actor_id: str
    capabilities: Capabilities
    incarnation: int
    registration_id: str
    weight_version: int
    last_seen: float  # on `clock`
    clock: Callable[[], float] = field(repr=False, compare=False)  # the registry's
    timeout_s: float = field(compare=False)  # silent for longer: stale
    groups_in_flight: int = 0
    tokens_per_second: float = 0.0
    time_shares: TimeShares = TimeShares()
    last_weight_report: dict[str, Any] | None = None
    superseded: deque[str] = field(default_factory=lambda: deque(maxlen=SUPERSEDED_KEPT))

    @property
    def holder(self) -> str:
        return f"{self.actor_id}#{self.incarnation}"

    @property
    def seconds_since_heartbeat(self) -> float:
        return self.clock() - self.last_seen

    @property
    def stale(self) -> bool:
        """Not heard from for the registry's actor_timeout_s."""
        return self.seconds_since_heartbeat > self.timeout_s


@dataclass(frozen=True)
class Registration:
    """The outcome of register(): the record, its new credential and, when it superseded another
    registration of the same id, how long ago that one was last heard from."""

    record: ActorRecord
    credential: str
    superseded_seen_s: float | None


class ActorRegistry:
    """Registered actors, their credentials and declared capabilities, bounded in number."""

    def __init__(self, max_actors: int, actor_timeout_s: float, *, minter: CredentialMinter | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._max_actors = max_actors
        self._timeout_s = actor_timeout_s
        self._minter = minter or CredentialMinter()
        self._clock = clock
        self._actors: dict[str, ActorRecord] = {}
        self._by_registration: dict[str, str] = {}  # current and superseded registration id -> actor id
        self._incarnations = 0

    def register(self, actor_id: str, capabilities: Capabilities, weight_version: int,
                 presented: str | None) -> Registration:
        """Register `actor_id`, renewing its registration if `presented` is its current credential.
        Raises Superseded if `presented` is one of its superseded credentials (a replaced client must
        not take the id back), MalformedCredential if `presented` is not shaped like a credential,
        RegistryFull if there is no room."""
        if presented and not well_formed(presented):
            raise MalformedCredential(actor_id)
        now = self._clock()
        record = self._actors.get(actor_id)
        renewal = False
        if record is not None and presented and self._minter.verify(actor_id, presented):
            presented_id = registration_id_of(presented)
            if presented_id in record.superseded:
                raise Superseded(f"actor {actor_id!r}: this registration was superseded by a newer one")
            renewal = presented_id == record.registration_id
        if record is None and not self._make_room():
            raise RegistryFull(f"{self._max_actors} live actors are registered")
        registration_id, credential = self._minter.mint(actor_id)
        superseded_seen_s = None
        if record is None:
            self._incarnations += 1
            record = ActorRecord(actor_id, capabilities, self._incarnations, registration_id, weight_version, now,
                                 self._clock, self._timeout_s)
            self._actors[actor_id] = record
        else:
            if renewal:
                del self._by_registration[record.registration_id]
            else:
                superseded_seen_s = now - record.last_seen
                self._supersede(record)
            record.capabilities, record.weight_version = capabilities, weight_version
            record.registration_id, record.last_seen = registration_id, now
        self._by_registration[registration_id] = actor_id
        return Registration(record, credential, superseded_seen_s)

    def authenticate(self, credential: str | None, actor_id: str | None = None) -> ActorRecord:
        """The record `credential` currently entitles; with `actor_id`, it must be that actor's.
        Raises UnknownCredential (MalformedCredential for a malformed one), Superseded or WrongActor."""
        if credential and not well_formed(credential):
            raise MalformedCredential(actor_id or "")
        registration_id = registration_id_of(credential or "")
        owner = self._by_registration.get(registration_id or "")
        if owner is None or not self._minter.verify(owner, credential):
            raise UnknownCredential("missing or unknown credential: register first")
        record = self._actors[owner]
        if registration_id != record.registration_id:
            raise Superseded(f"actor {owner!r}: this registration was superseded by a newer one")
        if actor_id is not None and actor_id != owner:
            raise WrongActor(f"the credential of actor {owner!r} cannot act as another actor")
        return record

    def current(self, actor_id: str, incarnation: int) -> ActorRecord:
        """The record of `actor_id` if `incarnation` is still its registered one (renewals keep it);
        else raises Superseded, or UnknownCredential (evicted). A group stream, authenticated once
        when it opened, checks this for every message."""
        record = self._actors.get(actor_id)
        if record is None:
            raise UnknownCredential(f"actor {actor_id!r} is no longer registered: register again")
        if record.incarnation != incarnation:
            raise Superseded(f"actor {actor_id!r}: this registration was superseded by a newer one")
        return record

    def touch(self, record: ActorRecord) -> None:
        """The actor was heard from now."""
        record.last_seen = self._clock()

    def live_count(self) -> int:
        """Actors heard from within actor_timeout_s."""
        return sum(not r.stale for r in self._actors.values())

    def records(self) -> list[ActorRecord]:
        """A copy of every record, by actor id: the caller reads them outside the service's lock."""
        return [dataclasses.replace(r, superseded=deque(r.superseded, maxlen=SUPERSEDED_KEPT))
                for _, r in sorted(self._actors.items())]

    def forget(self, actor_id: str) -> None:
        """Drop `actor_id` (evicted, or retired by the fleet): its credentials stop working."""
        record = self._actors.pop(actor_id, None)
        if record is not None:
            for registration_id in (record.registration_id, *record.superseded):
                self._by_registration.pop(registration_id, None)

    def _supersede(self, record: ActorRecord) -> None:
        """A new incarnation replaces `record`'s: its credential is remembered as superseded."""
        if len(record.superseded) == record.superseded.maxlen:
            self._by_registration.pop(record.superseded[0], None)
        record.superseded.append(record.registration_id)
        self._incarnations += 1
        record.incarnation = self._incarnations

    def _make_room(self) -> bool:
        """Keep the table bounded: when full, forget actors silent for actor_timeout_s."""
        if len(self._actors) < self._max_actors:
            return True
        silent = sorted((r.last_seen, actor_id) for actor_id, r in self._actors.items() if r.stale)
        for _, actor_id in silent[: len(self._actors) - self._max_actors + 1]:
            self.forget(actor_id)
        return len(self._actors) < self._max_actors

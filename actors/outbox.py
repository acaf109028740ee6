"""An actor's outbox of scored groups: what to send next on the group stream, and what an ack means.

Plain state, without threads, gRPC calls or clock reads (the caller passes `now`); LearnerClient
holds it under its condition variable, runs the stream and feeds the learner's acks in.

Groups. `add` puts a group in the outbox; it stays there (unacked) until an ack with a final status,
CONSUMED, DUPLICATE, STALE or INVALID, removes it. A QUEUED ack keeps it without sending it again
(the learner may still lose it in a restart); a RETRY ack queues it to be sent again, behind the
groups already waiting. An ack of any other status, or of a group no longer in the outbox, only
updates the credits.

Streams. Groups travel on one stream at a time, numbered by an epoch. `open_stream` starts the
next epoch: every unacked group, in the order it was added, waits to be sent (again; the learner's
de-duplication makes that safe) and no group awaits an ack on the new stream. `end_stream` retires
the epoch (a broken stream, counted as a reconnect); `is_current` tells a sender whether its stream
is still the current one.

Credits. Every ack carries the learner's credits for this actor (how many more groups it will queue
for it), and so does a registration (`set_credits`); before either, the credits are 1. A group sent
on the current stream without an ack yet awaits one; the available credits are the credits minus
the groups awaiting an ack. `next_send(now)` decides, in this order:
  - no group waits to be sent: Wait(IDLE_WAIT_S);
  - available credits > 0: send the first waiting group;
  - no group awaits an ack and `now` has reached the probe time: send the first waiting group as a
    probe (its ack tells the credits). The next probe is not before `now + delay`; the delay starts
    at PROBE_DELAY_S[0], doubles with every probe up to PROBE_DELAY_S[1], and a QUEUED ack resets it;
  - a group awaits an ack: Wait(IDLE_WAIT_S) (the ack will come);
  - else: Wait until the probe time, at least MIN_WAIT_S.
The waits are upper bounds: the caller asks again as soon as anything changes. `backlog_fits` says
whether the groups waiting to be sent fit in the available credits (`send_group` blocks until they
do).

Counts: submitted (groups added), sent (sends, probes included), resent (sends of a group sent
before, on an earlier stream or before a RETRY), one count per ack status of a group in the outbox
(queued, retry, consumed, duplicate, stale, invalid), reconnects (streams ended), and unacked
(groups in the outbox now). A count appears once it is non-zero; unacked always does.
"""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass
from typing import Generic, TypeVar

from tandem_wire import pb

__all__ = ["FINAL_STATUSES", "IDLE_WAIT_S", "MIN_WAIT_S", "PROBE_DELAY_S", "Outbox", "Send", "Wait"]

G = TypeVar("G")

FINAL_STATUSES = {
    pb.ACK_STATUS_CONSUMED: "consumed",
    pb.ACK_STATUS_DUPLICATE: "duplicate",
    pb.ACK_STATUS_STALE: "stale",
    pb.ACK_STATUS_INVALID: "invalid",
}
PROBE_DELAY_S = (0.05, 2.0)  # back-off range of credit probes (LearnerClient's reconnects use it too)
IDLE_WAIT_S = 0.5  # how long to wait for a new group or an ack before asking again
MIN_WAIT_S = 0.005  # the shortest wait for a probe time


@dataclass(frozen=True)
class Send(Generic[G]):
    """Send `group` now; `probe` when it goes without credits, to learn them."""

    group_id: str
    group: G
    probe: bool


@dataclass(frozen=True)
class Wait:
    """Nothing to send; ask again after `seconds` or when something changes."""

    seconds: float


class Outbox(Generic[G]):
    """The unacked groups of one actor and the credit, probe and stream-epoch protocol. Not thread-safe."""

    def __init__(self) -> None:
        self._unacked: dict[str, G] = {}  # insertion order = send order
        self._to_send: deque[str] = deque()
        self._awaiting: set[str] = set()  # sent on the current stream, no ack yet
        self._sent_before: set[str] = set()  # unacked ids sent at least once
        self._credits = 1
        self._probe_at = 0.0
        self._probe_delay = PROBE_DELAY_S[0]
        self._epoch = 0
        self._counts: Counter[str] = Counter()

    # ------------------------------------------------------------------ groups

    def add(self, group_id: str, group: G) -> None:
        """Queue a new group to be sent; ValueError when one with this id is already unacked."""
        if group_id in self._unacked:
            raise ValueError(f"group {group_id!r} is already waiting for an ack")
        self._unacked[group_id] = group
        self._to_send.append(group_id)
        self._counts["submitted"] += 1

    def is_unacked(self, group_id: str) -> bool:
        return group_id in self._unacked

    def unacked_count(self) -> int:
        return len(self._unacked)

    def counts(self) -> dict[str, int]:
        """The counts the module docstring lists."""
        return {**self._counts, "unacked": len(self._unacked)}

    # ------------------------------------------------------------------ streams

    def open_stream(self) -> int:
        """Start a new stream: every unacked group waits to be sent, in order. Returns its epoch."""
        self._epoch += 1
        self._to_send = deque(self._unacked)
        self._awaiting.clear()
        return self._epoch

    def end_stream(self) -> None:
        """The current stream broke: its epoch is over, and the client reconnects."""
        self._epoch += 1
        self._counts["reconnects"] += 1

    def is_current(self, epoch: int) -> bool:
        return epoch == self._epoch

    # ------------------------------------------------------------------ credits

    def set_credits(self, credits: int) -> None:
        self._credits = credits

    def available_credits(self) -> int:
        return self._credits - len(self._awaiting)

    def backlog_fits(self) -> bool:
        """Whether the groups waiting to be sent fit in the available credits."""
        return not self._to_send or len(self._to_send) <= self.available_credits()

    def next_send(self, now: float) -> Send[G] | Wait:
        """The group to send at `now` (recorded as sent), or how long to wait (module docstring)."""
        if not self._to_send:
            return Wait(IDLE_WAIT_S)
        if self.available_credits() > 0:
            return self._send(probe=False)
        if not self._awaiting and now >= self._probe_at:
            self._probe_at = now + self._probe_delay
            self._probe_delay = min(2 * self._probe_delay, PROBE_DELAY_S[1])
            return self._send(probe=True)
        return Wait(IDLE_WAIT_S if self._awaiting else max(MIN_WAIT_S, self._probe_at - now))

    def _send(self, probe: bool) -> Send[G]:
        group_id = self._to_send.popleft()
        self._awaiting.add(group_id)
        if group_id in self._sent_before:
            self._counts["resent"] += 1
        self._sent_before.add(group_id)
        self._counts["sent"] += 1
        return Send(group_id, self._unacked[group_id], probe)

    # ------------------------------------------------------------------ acks

    def record_ack(self, group_id: str, status: int, credits: int) -> str | None:
        """Apply one ack; returns the final status's name ("consumed", ...) when it removed the group."""
        self._awaiting.discard(group_id)
        self._credits = credits
        if group_id not in self._unacked:
            return None
        if status == pb.ACK_STATUS_QUEUED:
            self._counts["queued"] += 1
            self._probe_delay = PROBE_DELAY_S[0]
        elif status == pb.ACK_STATUS_RETRY:
            self._counts["retry"] += 1
            self._to_send.append(group_id)
        elif status in FINAL_STATUSES:
            return self._finish(group_id, FINAL_STATUSES[status])
        return None

    def _finish(self, group_id: str, name: str) -> str:
        self._counts[name] += 1
        del self._unacked[group_id]
        self._sent_before.discard(group_id)
        if group_id in self._to_send:
            self._to_send.remove(group_id)
        return name

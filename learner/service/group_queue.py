"""The learner's bounded queue of validated groups, with per-actor credits and staleness.

A group is in exactly one place: the queue (waiting for a batch), or the batch handed to the
trainer (waiting for mark_consumed). Not thread-safe: the service calls it under its own lock.

Batches take the groups of the oldest policy version first (arrival order among equals). The lease
budget (learner/service/lease_budget.py) bounds how many prompts are in use, not the order they come back
in: with first-in-first-out, an actor a step behind its peer had its groups overtaken by newer ones
and aged past the staleness bound in the queue (CI: 6 groups of version 7 dropped at dequeue at
latest 9, η = 1). Oldest first, a group can only be overtaken by groups at least as old, and the
budget allows too few of those to fill the batches that would age it (η = 1, B groups per step).
"""

from __future__ import annotations

import heapq
import itertools
from collections import Counter

from learner.service.group_validation import GroupRecord


def is_stale(policy_version: int, latest_version: int, max_staleness: int) -> bool:
    """A group sampled more than `max_staleness` versions behind the latest one is dropped."""
    return latest_version - policy_version > max_staleness


class GroupQueue:
    """At most `capacity` groups, popped oldest policy version first, plus the set handed out to the
    trainer."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"queue capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self._queue: list[tuple[int, int, GroupRecord]] = []  # heap of (policy_version, arrival, record)
        self._arrivals = itertools.count()
        self._queued_ids: set[str] = set()
        self._in_batch: dict[str, GroupRecord] = {}
        self._per_actor: Counter[str] = Counter()  # actor_id -> groups of it in the queue

    def __contains__(self, group_id: str) -> bool:
        return group_id in self._queued_ids or group_id in self._in_batch

    @property
    def depth(self) -> int:
        return len(self._queue)

    @property
    def in_batch(self) -> int:
        return len(self._in_batch)

    @property
    def tokens_in_queue(self) -> int:
        return sum(r.tokens for _, _, r in self._queue)

    @property
    def tokens_in_batch(self) -> int:
        return sum(r.tokens for r in self._in_batch.values())

    def full(self) -> bool:
        return len(self._queue) >= self.capacity

    def put(self, record: GroupRecord) -> None:
        if self.full():
            raise OverflowError("group queue is full")
        if record.group_id in self:
            raise KeyError(f"group {record.group_id!r} is already queued")
        heapq.heappush(self._queue, (record.policy_version, next(self._arrivals), record))
        self._queued_ids.add(record.group_id)
        self._per_actor[record.actor_id] += 1

    def pop(self) -> GroupRecord | None:
        """The queued group of the oldest policy version, first come among equals (moved to the
        handed-out set), or None when empty."""
        if not self._queue:
            return None
        _, _, record = heapq.heappop(self._queue)
        self._queued_ids.discard(record.group_id)
        self._per_actor[record.actor_id] -= 1
        if not self._per_actor[record.actor_id]:
            del self._per_actor[record.actor_id]
        self._in_batch[record.group_id] = record
        return record

    def handed_out(self, group_id: str) -> GroupRecord | None:
        return self._in_batch.get(group_id)

    def finish(self, group_id: str) -> GroupRecord:
        """Forget a handed-out group (consumed, or dropped as stale at dequeue)."""
        return self._in_batch.pop(group_id)

    def credits(self, actor_id: str, live_actors: int) -> int:
        """How many more groups `actor_id` may queue: its fair share of the capacity, bounded by the
        free space (the share is advisory; only a full queue makes the server answer RETRY)."""
        share = max(1, self.capacity // max(1, live_actors))
        return max(0, min(self.capacity - len(self._queue), share - self._per_actor[actor_id]))

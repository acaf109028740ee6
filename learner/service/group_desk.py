"""The group desk: what happens to each scored group, from the stream that brings it to the trainer that
consumes it. The service (learner/service/server.py) keeps the gRPC surface and hands every group here.

Admission: each group is examined and decided by the admission table (learner/service/admission.py) under
the rules of the newest version, and the decision applied: queued (and its prompt held), retired, released
for another lease, or refused, each with its counters and an ack on the actor's stream. The trainer takes
groups from the queue (`next_batch`), oldest policy first, dropping those gone stale while queued and
holding a step back while a late group may still come (learner/service/late_groups.py), and retires them
(`mark_consumed`), which tells their actors CONSUMED. Announcements (a new version, a grown lease budget)
go out on every open group stream.

Its methods run under the service's lock (`cond`, reentrant, which it is given): the public ones take it.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from learner.schema import ServiceConfig
from learner.service.accounting import Accounting, with_tokens
from learner.service.actor_registry import ActorRecord, ActorRegistry
from learner.service.admission import Decision, Effect, PromptFacts, Rules, Sender, decide, examine, internal_error
from learner.service.group_queue import GroupQueue, is_stale
from learner.service.group_stream import GroupStream
from learner.service.group_validation import GroupLimits, GroupRecord
from learner.service.late_groups import LateGroupWait
from learner.service.pacing import budget_step
from learner.service.prompt_source import PromptSource, PromptState
from learner.service.stale_log import StaleLog
from learner.service.tolerant_handlers import Undecodable
from tandem_wire import pb
from tandem_wire.limits import MAX_ACK_DETAIL_CHARS, MAX_ID_CHARS

log = logging.getLogger(__name__)


@dataclass
class Progress:
    """Where the learner stands, guarded by the service's lock: its step, its newest version, and the step
    at which it published each version."""

    step: int = 0
    latest_version: int = 0
    version_steps: dict[int, int] = field(default_factory=dict)


class GroupDesk:
    """Admits groups, queues them for the trainer, and acks them on their actors' streams."""

    def __init__(self, config: ServiceConfig, cond: Any, progress: Progress, prompts: PromptSource,
                 registry: ActorRegistry, accounting: Accounting) -> None:
        self._config = config
        self._cond = cond  # the service's condition variable
        self._progress = progress
        self._prompts = prompts
        self._registry = registry
        self._accounting = accounting
        self.queue = GroupQueue(config.admission.queue_capacity)
        self.stale = StaleLog()
        self.late = LateGroupWait(config.admission.late_group_wait_s)
        self._sinks: dict[str, GroupStream] = {}  # actor_id -> its current group stream
        limits = GroupLimits(0, config.group_size, config.vocab_size, config.max_prompt_tokens,
                             config.max_sequence_tokens)
        self._rules_cache = Rules(limits, config.admission.max_staleness)
        self._stopped = False

    def close(self) -> None:
        """The service stops: every group stream ends, and a waiting next_batch returns what it has."""
        self._stopped = True
        for stream in self._sinks.values():
            stream.close()
        self._sinks.clear()
        self._cond.notify_all()

    def next_batch(self, num_groups: int, timeout: float | None = None) -> list[GroupRecord]:
        """Block until `num_groups` fresh groups are queued (or `timeout` passes / the service stops)
        and hand them out, oldest policy version first; groups gone stale while queued are dropped
        (STALE ack, prompt re-leased). While a group leased η versions ago is still being sampled, no
        group is taken: it would go stale when this step publishes (learner/service/late_groups.py). The
        groups stay 'in batch' until mark_consumed."""
        deadline = None if timeout is None else time.monotonic() + timeout
        batch: list[GroupRecord] = []
        max_staleness = self._config.admission.max_staleness
        with self._cond:
            try:
                while True:
                    hold_s = self._hold_for_late_groups()
                    while not hold_s and len(batch) < num_groups and (record := self.queue.pop()) is not None:
                        if is_stale(record.policy_version, self._progress.latest_version, max_staleness):
                            self._drop_stale_at_dequeue(record)
                        else:
                            batch.append(record)
                    if len(batch) >= num_groups or self._stopped:
                        return batch
                    remaining = math.inf if deadline is None else deadline - time.monotonic()
                    if remaining <= 0:
                        return batch
                    wait_s = min(remaining, hold_s or math.inf)
                    self._cond.wait(None if wait_s == math.inf else wait_s)
            finally:
                self.late.release(time.monotonic())

    def _hold_for_late_groups(self) -> float:
        """Seconds to hold the next step's batch back for groups leased at budget step s − η or
        earlier (0: take groups now). The caller holds the lock."""
        if not self.late.wait_s or not self._config.prompts_per_step:
            return 0.0
        late, expires_in = 0, math.inf
        if not self.queue.full():
            through = self._progress.step - self._config.admission.max_staleness
            # an actor that has loaded newer weights since drained or re-sampled its groups in flight
            moved_on = {a.holder for a in self._registry.records() if self.budget_step(a) > through}
            late, expires_in = self._prompts.late_leases(through, moved_on)
        return self.late.hold(self._progress.step, time.monotonic(), late, expires_in)

    def mark_consumed(self, group_ids: Iterable[str], *, trained: bool = True) -> None:
        """The groups were used in a training step (or, not `trained`, retired without one, e.g. for
        lack of signal: their lease slots go back to the budget): retire their prompts for good and
        tell their actors (CONSUMED) so they forget them. Each id must have come from next_batch."""
        group_ids = list(group_ids)
        with self._cond:
            unknown = [g for g in group_ids if self.queue.handed_out(g) is None]
            if unknown or len(set(group_ids)) != len(group_ids):
                raise ValueError(f"not handed out by next_batch (or repeated): {unknown or group_ids}")
            for group_id in group_ids:
                record = self.queue.finish(group_id)
                self._prompts.retire(group_id, trained=trained)
                self._accounting.add_all({"groups_consumed": 1,
                                          "tokens_trained" if trained else "tokens_no_signal": record.tokens})
                self._notify_actor(record.actor_id, group_id, pb.ACK_STATUS_CONSUMED, "")
            if not trained:
                self.announce()  # their slots are back

    def budget_step(self, actor: ActorRecord) -> int:
        """`actor`'s budget step (learner/service/pacing.py) from the versions this learner published."""
        return budget_step(self._progress.step, actor.weight_version, self._progress.version_steps)

    def admit(self, actor_id: str, incarnation: int, msg: pb.ScoredGroup | Undecodable,
               stream: GroupStream) -> pb.GroupAck:
        """Decide one group's fate (learner/service/admission.py) and apply it. Raises CredentialRefused when
        the stream's registration ended; any other exception becomes a counted INVALID."""
        with self._cond:
            sender = self._sender(self._registry.current(actor_id, incarnation))
            limits = self._rules().limits
        try:
            outcome = examine(msg, sender, limits)
            with self._cond:
                decision = outcome if isinstance(outcome, Decision) else self._decide(outcome, sender)
                return self._settle(decision, sender, msg, stream)
        except Exception as error:  # never let one message take the stream down; count it
            log.warning("unexpected error admitting a group from %r", sender.actor_id, exc_info=error)
            with self._cond:
                return self._settle(internal_error(error), sender, msg, stream)

    def _decide(self, record: GroupRecord, sender: Sender) -> Decision:
        group_id = record.group_id
        state = self._prompts.state(group_id)
        if state is PromptState.OUTSTANDING:
            facts = PromptFacts(state, self._prompts.prompt(group_id).prompt_ids, self._prompts.lease_info(group_id))
        else:
            facts = PromptFacts(state)
        return decide(record, sender, facts, self._rules(), self.queue.full())

    def _settle(self, decision: Decision, sender: Sender, msg: pb.ScoredGroup | Undecodable,
                stream: GroupStream) -> pb.GroupAck:
        """Apply a decision's effect, add its counters (together, under the lock) and encode its ack."""
        group_id = "" if isinstance(msg, Undecodable) else msg.group_id
        if decision.effect is Effect.QUEUE:
            self.queue.put(decision.record)
            self._prompts.hold(group_id)
            self._sinks[sender.actor_id] = stream
            self._cond.notify_all()
        elif decision.effect is Effect.RETIRE:
            self._prompts.retire(group_id, trained=False)
            self.announce()  # its slot is back
        elif decision.effect is Effect.RELEASE:
            self._prompts.release(group_id, holder=sender.holder)
            self.announce()
        if decision.status == pb.ACK_STATUS_STALE:
            self._record_stale(group_id, sender.actor_id, msg.policy_version, in_queue=False)
        tokens = 0 if isinstance(msg, Undecodable) else sum(len(c.token_ids) for c in msg.completions)
        self._accounting.add_all(with_tokens(decision.counters, tokens))
        return self._ack(sender.actor_id, group_id, decision.status, decision.detail)

    def _sender(self, actor: ActorRecord) -> Sender:
        caps = actor.capabilities
        return Sender(actor.actor_id, actor.holder, caps.max_model_len, caps.max_prompt_tokens)

    def stream_ended(self, stream: GroupStream) -> None:
        with self._cond:
            if self._sinks.get(stream.actor_id) is stream:
                del self._sinks[stream.actor_id]

    def announce(self) -> None:
        """An ack with no group on every open group stream: the newest version and the actor's credits.
        Sent when a version is published and when the lease budget grows (a step, slots given back),
        so that an actor waiting for prompts asks again now, not at its retry hint."""
        for actor_id, stream in self._sinks.items():
            stream.offer(pb.GroupAck(credits=self.credits(actor_id), latest_version=self._progress.latest_version))

    def _drop_stale_at_dequeue(self, record: GroupRecord) -> None:
        self.queue.finish(record.group_id)
        self._prompts.release(record.group_id)
        self.announce()
        self._accounting.add_all({"groups_stale_at_dequeue": 1, "tokens_stale_at_dequeue": record.tokens})
        self._record_stale(record.group_id, record.actor_id, record.policy_version, in_queue=True)
        self._notify_actor(
            record.actor_id,
            record.group_id,
            pb.ACK_STATUS_STALE,
            f"stale at dequeue: policy_version {record.policy_version}, latest {self._progress.latest_version}",
        )

    def _record_stale(self, group_id: str, actor_id: str, policy_version: int, *, in_queue: bool) -> None:
        first_published = next(iter(self._progress.version_steps), None)
        cause = self.stale.record(in_queue=in_queue, group_id=group_id, actor_id=actor_id,
                                   policy_version=policy_version, latest_version=self._progress.latest_version,
                                   first_published=first_published)
        log.debug("group %.64s from %.64s stale (%s)", group_id, actor_id, cause)

    def _notify_actor(self, actor_id: str, group_id: str, status: int, detail: str) -> None:
        """A later ack (CONSUMED / STALE) on the actor's current stream, if it is connected; if not,
        the actor re-sends the group after reconnecting and learns its fate then."""
        stream = self._sinks.get(actor_id)
        if stream is not None:
            stream.offer(self._ack(actor_id, group_id, status, detail))

    def _ack(self, actor_id: str, group_id: str, status: int, detail: str) -> pb.GroupAck:
        """An ack; it echoes at most MAX_ID_CHARS of the id and MAX_ACK_DETAIL_CHARS of the detail.
        Each refusal's detail goes to the debug log only: the console shows the counters."""
        if status not in (pb.ACK_STATUS_QUEUED, pb.ACK_STATUS_CONSUMED):
            log.debug("group %.64s from %.64s: %s: %.256s", group_id, actor_id, pb.AckStatus.Name(status), detail)
        return pb.GroupAck(
            group_id=group_id[:MAX_ID_CHARS],
            status=status,
            detail=detail[:MAX_ACK_DETAIL_CHARS],
            credits=self.credits(actor_id),
            latest_version=self._progress.latest_version,
        )

    def credits(self, actor_id: str) -> int:
        return self.queue.credits(actor_id, self._registry.live_count())

    def _rules(self) -> Rules:
        """The admission rules under the latest version (rebuilt only when it changes)."""
        if self._rules_cache.limits.latest_version != self._progress.latest_version:
            limits = dataclasses.replace(self._rules_cache.limits, latest_version=self._progress.latest_version)
            self._rules_cache = Rules(limits, self._config.admission.max_staleness)
        return self._rules_cache


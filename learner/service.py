"""The learner's gRPC server (tandem_wire `Learner` service) and the trainer-facing API, in one object.

Actors register, heartbeat, lease prompts from the learner's PromptSource, stream scored groups
(answered per group with QUEUED / DUPLICATE / STALE / INVALID / RETRY plus credits, and later with
CONSUMED), and pull versioned weights as a chunked stream ending in a checksummed commit.
The trainer calls next_batch / mark_consumed / publish_weights / state_dict.

Exactly-once: a group id is a prompt key; a prompt is retired (and its group id refused as a
duplicate from then on) when mark_consumed is called for it, and the retired set is part of
state_dict(). A checkpoint restored with load_state_dict() forgets queued-but-unconsumed groups;
their actors still hold them (they were only QUEUED, never CONSUMED) and send them again.

After load_state_dict() the trainer should publish its restored weights again (the restored
version number is allowed once) so that actors can fetch them.

Threads: gRPC runs each call on its pool (a StreamGroups call holds one pool thread plus one
reader thread for its lifetime, so `max_workers` must exceed the number of connected actors,
with room for their unary calls); all shared state is guarded by one condition variable.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import numpy as np

from learner.accounting import Accounting, balance_violations
from learner.auth import BearerTokenInterceptor
from learner.group_queue import GroupQueue, is_stale
from learner.group_validation import (
    CompletionRecord,
    GroupLimits,
    GroupRecord,
    InvalidGroup,
    parse_group,
)
from learner.prompt_source import PromptSource, PromptState
from learner.tolerant_handlers import Undecodable, add_tolerant_learner_servicer
from learner.weight_publisher import WeightPublisher, pack_weights
from tandem_wire import WEIGHT_CHUNK_BYTES, WIRE_VERSION, grpc_options, pb, rpc

__all__ = [
    "LearnerService",
    "ServiceConfig",
    "GroupRecord",
    "CompletionRecord",
    "ActorView",
    "balance_violations",
]

log = logging.getLogger(__name__)

STATE_FORMAT = 1
MAX_PROMPTS_PER_LEASE = 1024
ACK_BUFFER = 4096  # acks waiting for a slow reader, per stream; beyond it the reader blocks
_END = object()  # sentinel closing a stream's ack buffer


@dataclass(frozen=True)
class ServiceConfig:
    """How the learner's server validates, queues and serves (0 / None disables a limit)."""

    queue_capacity: int = 64
    max_staleness: int = 1
    group_size: int = 0  # completions per group; 0 = any number >= 1
    lease_seconds: float = 60.0
    max_prompt_tokens: int = 0  # 0 = no limit
    auth_token: str | None = None  # when set, every RPC needs `authorization: Bearer <token>`
    vocab_size: int | None = None  # when set, token ids must be in [0, vocab_size)
    heartbeat_interval_s: float = 5.0
    actor_timeout_s: float = 30.0  # an actor silent this long is reported stale
    max_group_bytes: int = 16 * 1024 * 1024  # largest ScoredGroup message accepted
    weight_chunk_bytes: int = WEIGHT_CHUNK_BYTES
    tls_cert_path: str | None = None  # PEM; TLS when both cert and key are set
    tls_key_path: str | None = None
    max_workers: int = 256  # each connected actor's group stream holds one worker
    max_actors: int = 4096  # registered actors kept; silent ones are evicted first
    mode: str = "rl"


@dataclass
class ActorView:
    """What the learner knows of one actor (actors_status())."""

    actor_id: str
    weight_version: int
    seconds_since_heartbeat: float
    groups_in_flight: int
    tokens_per_second: float
    stale: bool
    capabilities: dict[str, Any]
    last_weight_report: dict[str, Any] | None


@dataclass
class _Actor:
    capabilities: dict[str, Any]
    weight_version: int
    last_seen: float
    groups_in_flight: int = 0
    tokens_per_second: float = 0.0
    last_weight_report: dict[str, Any] | None = None


class LearnerService(rpc.LearnerServicer):
    """gRPC servicer of tandem's Learner service plus the trainer-facing API."""

    def __init__(self, prompts: PromptSource, config: ServiceConfig | None = None) -> None:
        self.config = config or ServiceConfig()
        self._prompts = prompts
        self._cond = threading.Condition(threading.RLock())
        self._queue = GroupQueue(self.config.queue_capacity)
        self._accounting = Accounting()
        self._weights = WeightPublisher()
        self._latest_version = 0
        self._step = 0
        self._actors: dict[str, _Actor] = {}
        self._sinks: dict[str, queue.Queue] = {}  # actor_id -> ack buffer of its current stream
        self._server: grpc.Server | None = None
        self._stopped = False

    # ================================================================== lifecycle

    def start(self, address: str = "127.0.0.1:0") -> str:
        """Serve on `address` (port 0 = any free port); returns "host:port"."""
        if self._server is not None:
            raise RuntimeError("service already started")
        cfg = self.config
        server = grpc.server(
            ThreadPoolExecutor(max_workers=cfg.max_workers, thread_name_prefix="tandem-learner"),
            options=self._server_options(),
            interceptors=[BearerTokenInterceptor(cfg.auth_token)] if cfg.auth_token else [],
        )
        add_tolerant_learner_servicer(self, server)
        if cfg.tls_cert_path or cfg.tls_key_path:
            if not (cfg.tls_cert_path and cfg.tls_key_path):
                raise ValueError("TLS needs both tls_cert_path and tls_key_path")
            credentials = grpc.ssl_server_credentials(
                [(Path(cfg.tls_key_path).read_bytes(), Path(cfg.tls_cert_path).read_bytes())]
            )
            port = server.add_secure_port(address, credentials)
        else:
            port = server.add_insecure_port(address)
        server.start()
        self._server = server
        return f"{address.rsplit(':', 1)[0]}:{port}"

    def stop(self, grace: float | None = 1.0) -> None:
        """Stop serving; pending next_batch calls return what they have."""
        if self._server is not None:
            self._server.stop(grace).wait()
        with self._cond:
            self._stopped = True
            for sink in self._sinks.values():
                _offer(sink, _END)
            self._sinks.clear()
            self._cond.notify_all()

    def _server_options(self) -> list[tuple[str, int]]:
        # Weights go out in big chunks; groups come in and are bounded separately (hostile input).
        options = dict(grpc_options())
        options["grpc.max_receive_message_length"] = self.config.max_group_bytes
        options.update(
            {
                "grpc.so_reuseport": 0,  # a second learner on the same port must fail, not share it
                # Clients ping every keepalive_time_ms even when idle; do not punish them for it.
                "grpc.http2.min_recv_ping_interval_without_data_ms": 10_000,
                "grpc.http2.max_ping_strikes": 0,
            }
        )
        return list(options.items())

    # ================================================================== trainer-facing API

    def next_batch(self, num_groups: int, timeout: float | None = None) -> list[GroupRecord]:
        """Block until `num_groups` fresh groups are queued (or `timeout` passes / the service stops)
        and hand them out; groups gone stale while queued are dropped (STALE ack, prompt re-leased).
        The groups stay 'in batch' until mark_consumed."""
        deadline = None if timeout is None else time.monotonic() + timeout
        batch: list[GroupRecord] = []
        with self._cond:
            while True:
                while len(batch) < num_groups and (record := self._queue.pop()) is not None:
                    if is_stale(record.policy_version, self._latest_version, self.config.max_staleness):
                        self._drop_stale_at_dequeue(record)
                    else:
                        batch.append(record)
                if len(batch) >= num_groups or self._stopped:
                    return batch
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return batch
                self._cond.wait(remaining)

    def mark_consumed(self, group_ids: Iterable[str]) -> None:
        """The groups were used in a training step: retire their prompts for good and tell their
        actors (CONSUMED) so they forget them. Each id must have come from next_batch."""
        group_ids = list(group_ids)
        with self._cond:
            unknown = [g for g in group_ids if self._queue.handed_out(g) is None]
            if unknown or len(set(group_ids)) != len(group_ids):
                raise ValueError(f"not handed out by next_batch (or repeated): {unknown or group_ids}")
            for group_id in group_ids:
                record = self._queue.finish(group_id)
                self._prompts.retire(group_id)
                self._accounting.add("groups_consumed")
                self._notify_actor(record.actor_id, group_id, pb.ACK_STATUS_CONSUMED, "")

    def publish_weights(self, version: int, tensors: Iterable[tuple[str, np.ndarray]]) -> None:
        """Serialise, checksum and publish a weight version; actors see it in acks and heartbeats.

        Versions increase; the version restored by load_state_dict may be published once more."""
        with self._cond:
            self._check_publishable(version)
        weights = pack_weights(version, tensors, self.config.weight_chunk_bytes)
        with self._cond:
            self._check_publishable(version)
            self._weights.publish(weights)
            self._latest_version = version

    def set_step(self, step: int) -> None:
        with self._cond:
            self._step = step

    @property
    def latest_version(self) -> int:
        with self._cond:
            return self._latest_version

    def accounting(self) -> dict[str, int]:
        """All counters (see learner/accounting.py for the invariants they satisfy)."""
        with self._cond:
            counts = self._accounting.snapshot()
            counts.update(self._prompts.counts())
            counts["groups_in_queue"] = self._queue.depth
            counts["groups_in_batch"] = self._queue.in_batch
            counts["groups_stale"] = counts["groups_stale_on_arrival"] + counts["groups_stale_at_dequeue"]
            return counts

    def queue_depth(self) -> int:
        with self._cond:
            return self._queue.depth

    def actors_status(self) -> list[ActorView]:
        """Every registered actor; `stale` ones have not been heard from for actor_timeout_s."""
        now = time.monotonic()
        with self._cond:
            return [
                ActorView(
                    actor_id,
                    a.weight_version,
                    now - a.last_seen,
                    a.groups_in_flight,
                    a.tokens_per_second,
                    now - a.last_seen > self.config.actor_timeout_s,
                    dict(a.capabilities),
                    a.last_weight_report,
                )
                for actor_id, a in sorted(self._actors.items())
            ]

    def state_dict(self) -> dict[str, Any]:
        """JSON-serialisable exactly-once state for the checkpoint (prompts, counters, versions)."""
        with self._cond:
            return {
                "format": STATE_FORMAT,
                "step": self._step,
                "latest_version": self._latest_version,
                "prompts": self._prompts.state_dict(),
                "accounting": self._accounting.snapshot(),
                "unconsumed_groups": self._queue.depth + self._queue.in_batch,
            }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a state_dict() before start(); queued groups of the old run are forgotten (their
        actors send them again) and counted as groups_forgotten_on_restart."""
        if state.get("format") != STATE_FORMAT:
            raise ValueError(f"unsupported service state format {state.get('format')!r}")
        with self._cond:
            if self._server is not None:
                raise RuntimeError("load_state_dict must be called before start()")
            self._prompts.load_state_dict(state["prompts"], lease_seconds=self.config.lease_seconds)
            self._accounting.load(state["accounting"])
            self._accounting.add("groups_forgotten_on_restart", int(state["unconsumed_groups"]))
            self._step = int(state["step"])
            self._latest_version = int(state["latest_version"])

    # ================================================================== RPCs

    def Register(self, request: pb.RegisterRequest, context: grpc.ServicerContext) -> pb.RegisterReply:
        _check_caller(request, context)
        c = request.capabilities
        capabilities = {
            "engine": c.engine,
            "model_family": c.model_family,
            "max_model_len": c.max_model_len,
            "group_size": c.group_size,
            "host": c.host,
        }
        with self._cond:
            actor = self._actors.get(request.actor_id)
            if actor is None:
                if not self._make_room_for_an_actor():
                    context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "too many live actors registered")
                self._actors[request.actor_id] = _Actor(
                    capabilities, request.weight_version, time.monotonic()
                )
            else:
                actor.capabilities, actor.weight_version = capabilities, request.weight_version
                actor.last_seen = time.monotonic()
            return pb.RegisterReply(
                latest_version=self._latest_version,
                heartbeat_interval_ms=int(self.config.heartbeat_interval_s * 1000),
                credits=self._credits(request.actor_id),
                max_staleness=self.config.max_staleness,
            )

    def Heartbeat(self, request: pb.HeartbeatRequest, context: grpc.ServicerContext) -> pb.HeartbeatReply:
        _check_caller(request, context)
        with self._cond:
            actor = self._actors.get(request.actor_id)
            if actor is not None:
                actor.last_seen = time.monotonic()
                actor.weight_version = request.weight_version
                actor.groups_in_flight = request.groups_in_flight
                actor.tokens_per_second = request.tokens_per_second
            return pb.HeartbeatReply(latest_version=self._latest_version, registered=actor is not None)

    def LeasePrompts(
        self, request: pb.LeasePromptsRequest, context: grpc.ServicerContext
    ) -> pb.LeasePromptsReply:
        _check_caller(request, context)
        if request.max_prompts < 0:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"max_prompts {request.max_prompts} < 0")
        with self._cond:
            actor = self._actors.get(request.actor_id)
            if actor is None:
                context.abort(grpc.StatusCode.FAILED_PRECONDITION, "actor not registered")
            actor.last_seen = time.monotonic()
            leased = self._prompts.lease(
                request.actor_id, min(request.max_prompts, MAX_PROMPTS_PER_LEASE), self.config.lease_seconds
            )
            exhausted = self._prompts.exhausted()
        return pb.LeasePromptsReply(
            prompts=[
                pb.Prompt(group_id=p.group_id, token_ids=p.prompt_ids, text=p.text, metadata=p.metadata)
                for p in leased
            ],
            exhausted=exhausted,
            lease_seconds=self.config.lease_seconds,
        )

    def StreamGroups(
        self, request_iterator: Iterator[pb.ScoredGroup], context: grpc.ServicerContext
    ) -> Iterator[pb.GroupAck]:
        """Acks for the groups read (by a helper thread) plus CONSUMED/STALE acks sent later."""
        sink: queue.Queue = queue.Queue(maxsize=ACK_BUFFER)
        finished = threading.Event()
        context.add_callback(finished.set)
        reader = threading.Thread(
            target=self._read_groups,
            args=(request_iterator, sink, finished),
            name="tandem-group-reader",
            daemon=True,
        )
        reader.start()
        while not finished.is_set():
            try:
                ack = sink.get(timeout=0.2)
            except queue.Empty:
                continue
            if ack is _END:
                return
            yield ack

    def FetchWeights(self, request: pb.FetchWeightsRequest, context: grpc.ServicerContext) -> Iterator[bytes]:
        _check_caller(request, context)
        try:
            weights = self._weights.acquire(request.version)
        except KeyError as error:
            context.abort(grpc.StatusCode.NOT_FOUND, str(error.args[0]))
        try:
            yield from weights.messages  # serialised once at publish time
        finally:
            self._weights.release(weights)

    def ReportWeights(self, request: pb.WeightReport, context: grpc.ServicerContext) -> pb.WeightReportReply:
        _check_decoded(request, context)
        if not request.actor_id:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "empty actor_id")
        with self._cond:
            actor = self._actors.get(request.actor_id)
            if actor is not None:
                actor.last_weight_report = {
                    "version": request.version,
                    "applied": request.applied,
                    "detail": request.detail,
                    "stall_seconds": request.stall_seconds,
                    "transfer_seconds": request.transfer_seconds,
                }
                if request.applied:
                    actor.weight_version = request.version
        return pb.WeightReportReply()

    def Status(self, request: pb.StatusRequest, context: grpc.ServicerContext) -> pb.StatusReply:
        _check_decoded(request, context)
        counts = self.accounting()
        with self._cond:
            return pb.StatusReply(
                step=self._step,
                weight_version=self._latest_version,
                queue_depth=self._queue.depth,
                queue_capacity=self._queue.capacity,
                actors=[
                    pb.ActorStatus(
                        actor_id=a.actor_id,
                        weight_version=a.weight_version,
                        seconds_since_heartbeat=a.seconds_since_heartbeat,
                        groups_in_flight=a.groups_in_flight,
                        tokens_per_second=a.tokens_per_second,
                    )
                    for a in self.actors_status()
                ],
                accounting=pb.Accounting(
                    **{k: v for k, v in counts.items() if k in pb.Accounting.DESCRIPTOR.fields_by_name}
                ),
                mode=self.config.mode,
            )

    # ================================================================== group handling

    def _read_groups(
        self, request_iterator: Iterator[pb.ScoredGroup], sink: queue.Queue, finished: threading.Event
    ) -> None:
        """Validate each incoming group and buffer its ack; ends the stream when the actor does."""
        try:
            for msg in request_iterator:
                ack = self._receive_group(msg, sink)
                while not finished.is_set():
                    try:
                        sink.put(ack, timeout=0.2)
                        break
                    except queue.Full:
                        continue
        except Exception as error:  # a broken or cancelled stream (or undecodable bytes) ends it
            log.debug("group stream ended: %r", error)
        finally:
            with self._cond:
                for actor_id in [a for a, s in self._sinks.items() if s is sink]:
                    del self._sinks[actor_id]
            _offer(sink, _END)

    def _receive_group(self, msg: pb.ScoredGroup | Undecodable, sink: queue.Queue) -> pb.GroupAck:
        """Decide one group's fate. The counters of each outcome (and groups_received) change
        together under the lock, so every snapshot of them balances."""
        if isinstance(msg, Undecodable):
            return self._reject(pb.ScoredGroup(), pb.ACK_STATUS_INVALID, msg.error)
        try:
            record = parse_group(msg, self._limits())
        except InvalidGroup as error:
            return self._reject(msg, pb.ACK_STATUS_INVALID, str(error))
        except Exception as error:  # never let one message take the stream down; count it
            log.exception("unexpected error validating group %r", msg.group_id)
            return self._reject(msg, pb.ACK_STATUS_INVALID, f"internal error: {error!r}")
        with self._cond:
            group_id = record.group_id
            state = self._prompts.state(group_id)
            if state is PromptState.RETIRED:
                return self._reject(msg, pb.ACK_STATUS_DUPLICATE, "already consumed")
            if state is PromptState.HELD:
                return self._reject(msg, pb.ACK_STATUS_DUPLICATE, "already queued")
            if state is PromptState.UNISSUED and is_stale(record.policy_version, self._latest_version,
                                                          self.config.max_staleness):
                # leased by this run before the learner restarted from an earlier checkpoint: the
                # prompt is issued again when the cursor reaches it
                return self._reject(msg, pb.ACK_STATUS_STALE, "sampled before the learner restarted from an "
                                                             "earlier checkpoint; the prompt will be issued again")
            if state in (PromptState.UNKNOWN, PromptState.UNISSUED):
                return self._reject(msg, pb.ACK_STATUS_INVALID, "group_id was never leased by this learner")
            if record.rejected_reason:
                self._prompts.retire(group_id)
                self._accounting.add("groups_received")
                self._accounting.add("prompts_too_long")
                return self._ack(
                    msg.actor_id,
                    group_id,
                    pb.ACK_STATUS_CONSUMED,
                    f"prompt retired: {record.rejected_reason}",
                )
            expected = self._prompts.prompt(group_id).get("prompt_ids")
            if expected is not None and len(expected) and [int(t) for t in expected] != record.prompt_ids:
                return self._reject(
                    msg, pb.ACK_STATUS_INVALID, "prompt_token_ids differ from the leased prompt"
                )
            if is_stale(record.policy_version, self._latest_version, self.config.max_staleness):
                self._prompts.release(group_id, holder=record.actor_id)
                return self._reject(
                    msg,
                    pb.ACK_STATUS_STALE,
                    f"policy_version {record.policy_version} is more than "
                    f"{self.config.max_staleness} behind {self._latest_version}",
                )
            if self._queue.full():
                return self._reject(msg, pb.ACK_STATUS_RETRY, "queue full")
            self._queue.put(record)
            self._prompts.hold(group_id)
            self._sinks[record.actor_id] = sink
            self._accounting.add("groups_received")
            self._accounting.add("groups_queued")
            self._accounting.add(
                "completions_unscorable", sum(c.unscorable_reason is not None for c in record.completions)
            )
            self._cond.notify_all()
            return self._ack(record.actor_id, group_id, pb.ACK_STATUS_QUEUED, "")

    _REJECTION_COUNTERS = {
        pb.ACK_STATUS_INVALID: "groups_invalid",
        pb.ACK_STATUS_DUPLICATE: "groups_duplicate",
        pb.ACK_STATUS_STALE: "groups_stale_on_arrival",
        pb.ACK_STATUS_RETRY: "groups_retry",
    }

    def _reject(self, msg: pb.ScoredGroup, status: int, detail: str) -> pb.GroupAck:
        with self._cond:
            self._accounting.add("groups_received")
            self._accounting.add(self._REJECTION_COUNTERS[status])
            return self._ack(msg.actor_id, msg.group_id, status, detail)

    def _drop_stale_at_dequeue(self, record: GroupRecord) -> None:
        self._queue.finish(record.group_id)
        self._prompts.release(record.group_id)
        self._accounting.add("groups_stale_at_dequeue")
        self._notify_actor(
            record.actor_id,
            record.group_id,
            pb.ACK_STATUS_STALE,
            f"stale at dequeue: policy_version {record.policy_version}, latest {self._latest_version}",
        )

    def _notify_actor(self, actor_id: str, group_id: str, status: int, detail: str) -> None:
        """A later ack (CONSUMED / STALE) on the actor's current stream, if it is connected; if not,
        the actor re-sends the group after reconnecting and learns its fate then."""
        sink = self._sinks.get(actor_id)
        if sink is not None:
            _offer(sink, self._ack(actor_id, group_id, status, detail))

    def _ack(self, actor_id: str, group_id: str, status: int, detail: str) -> pb.GroupAck:
        return pb.GroupAck(
            group_id=group_id,
            status=status,
            detail=detail[:1000],
            credits=self._credits(actor_id),
            latest_version=self._latest_version,
        )

    def _make_room_for_an_actor(self) -> bool:
        """Keep the actor table bounded: when full, forget actors silent for actor_timeout_s."""
        if len(self._actors) < self.config.max_actors:
            return True
        now = time.monotonic()
        silent = sorted(
            (a.last_seen, actor_id)
            for actor_id, a in self._actors.items()
            if now - a.last_seen > self.config.actor_timeout_s
        )
        for _, actor_id in silent[: len(self._actors) - self.config.max_actors + 1]:
            del self._actors[actor_id]
        return len(self._actors) < self.config.max_actors

    def _credits(self, actor_id: str) -> int:
        now = time.monotonic()
        live = sum(now - a.last_seen <= self.config.actor_timeout_s for a in self._actors.values())
        return self._queue.credits(actor_id, live)

    def _limits(self) -> GroupLimits:
        with self._cond:
            latest = self._latest_version
        cfg = self.config
        return GroupLimits(
            latest_version=latest,
            group_size=cfg.group_size,
            vocab_size=cfg.vocab_size,
            max_prompt_tokens=cfg.max_prompt_tokens,
        )

    def _check_publishable(self, version: int) -> None:
        held = self._weights.latest_version
        if version < self._latest_version or (held is not None and version <= held):
            raise ValueError(f"weight version {version} must be newer than {self._latest_version}")


def _check_decoded(request: Any, context: grpc.ServicerContext) -> None:
    if isinstance(request, Undecodable):
        context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.error)


def _check_caller(request: Any, context: grpc.ServicerContext) -> None:
    _check_decoded(request, context)
    if request.wire_version != WIRE_VERSION:
        context.abort(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"unsupported wire_version {request.wire_version} (this learner speaks {WIRE_VERSION})",
        )
    if not request.actor_id:
        context.abort(grpc.StatusCode.INVALID_ARGUMENT, "empty actor_id")


def _offer(sink: queue.Queue, item: object) -> None:
    """Put without blocking; a full buffer means the actor stopped reading, and it will learn the
    group's fate when it re-sends after reconnecting."""
    try:
        sink.put_nowait(item)
    except queue.Full:
        pass

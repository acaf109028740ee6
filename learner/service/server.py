"""The learner's gRPC server (tandem_wire `Learner` service) and the trainer-facing API.

Actors register, heartbeat, lease prompts from the learner's PromptSource (at most as many as the
lease budget allows: (max_staleness + step + 1)·prompts_per_step in use, learner/service/lease_budget.py;
an actor given fewer than it asked for gets a hint for when to ask again: the pacing table,
learner/service/pacing.py), stream scored groups (answered per group with QUEUED / DUPLICATE / STALE /
INVALID / RETRY plus credits, and later with CONSUMED), and pull versioned weights as a chunked stream
ending in a checksummed commit. The trainer calls next_batch / mark_consumed / publish_weights / state_dict.

Exactly-once: a group id is a prompt key; a prompt is retired (and its group id refused as a
duplicate from then on) when mark_consumed is called for it, and the retired set is part of
state_dict(). A checkpoint restored with load_state_dict() forgets queued-but-unconsumed groups;
their actors still hold them (they were only QUEUED, never CONSUMED) and send them again.

After load_state_dict() the trainer should publish its restored weights again (the restored
version number is allowed once) so that actors can fetch them.

Who may do what: every call needs the run's shared token when one is set (tandem_wire/auth.py).
Register needs the enrollment token the run's fleet minted for the id (learner/service/enrollment.py)
and returns the actor's own credential (learner/service/actor_registry.py); Heartbeat, LeasePrompts,
StreamGroups and ReportWeights must carry it and may only act as that actor. FetchWeights and
Status only read. Every field is checked against its documented bound at the door
(learner/service/request_checks.py, learner/service/group_validation.py), and what each group gets is the
admission table's decision (learner/service/admission.py), applied by the group desk
(learner/service/group_desk.py); versions and their transports are the weight desk's (learner/weights/desk.py).

Threads: gRPC runs each call on one pool of max_streams + max_weight_streams + unary_workers +
unverified_unary_calls + status_workers workers. Calls are capped by the identity they prove, checked
before they take a slot (`_vouched_for`: an HMAC over bounded input, no lock): a credential this learner
minted for the actor id the call names or, on Register, the run's enrollment token for it. Group streams
(at most max_streams, max_streams_per_actor per actor) and weight streams (at most max_weight_streams,
max_weight_streams_per_actor per verified actor and max_anonymous_weight_streams for the rest) hold a
worker each for their lifetime. Unary calls hold at most unary_calls_per_actor per verified actor, and
those that prove no identity (whatever id they name) at most unverified_unary_calls together, so they
never take a verified actor's slots or the unary_workers its calls need. A call past a cap is refused
RESOURCE_EXHAUSTED at once. Status is served apart (call_limits.SharedReply): status_workers build it,
other callers meanwhile share the newest reply. A group stream also has a reader thread
(learner/service/group_stream.py). Long calls without progress for stream_idle_timeout_s are cancelled.
All shared state is guarded by one condition variable.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import numpy as np

from learner.schema import ServiceConfig
from learner.service import request_checks
from learner.service.accounting import Accounting, balance_violations
from learner.service.actor_registry import (
    ActorRecord,
    ActorRegistry,
    CredentialRefused,
    MalformedCredential,
    RegistryFull,
    UnknownCredential,
)
from learner.service.call_limits import AtCapacity, CallSlots, SharedReply
from learner.service.credentials import CredentialMinter
from learner.service.enrollment import EnrollmentGate, NotEnrolled
from learner.service.group_desk import GroupDesk, Progress
from learner.service.group_stream import GroupStream
from learner.service.group_validation import CompletionRecord, GroupRecord
from learner.service.lease_budget import StepPace
from learner.service.pacing import LeaseAsk, LeaseOutcome, decide_lease, may_lease
from learner.service.prompt_source import PromptSource
from learner.service.tolerant_handlers import Undecodable, add_tolerant_learner_servicer
from learner.weights.desk import WeightDesk, WeightsNotHeld
from learner.weights.versions import UnknownWeightVersion
from learner.wire_bounds import InvalidInput, check_int
from tandem_wire import grpc_options, pb, rpc
from tandem_wire.auth import BearerTokenInterceptor
from tandem_wire.idle import IdleReaper
from tandem_wire.limits import (
    CREDENTIAL_METADATA_KEY,
    ENROLLMENT_METADATA_KEY,
    MAX_ACK_DETAIL_CHARS,
    MAX_ID_CHARS,
    MAX_METADATA_BYTES,
)
from tandem_wire.log_throttle import KeyedThrottle
from tandem_wire.weights.transports import ANSWER_METADATA_KEY, OFFERS_METADATA_KEY

__all__ = [
    "LearnerService",
    "ServiceConfig",
    "GroupRecord",
    "CompletionRecord",
    "ActorRecord",
    "balance_violations",
]

log = logging.getLogger(__name__)

STATE_FORMAT = 1
MAX_PROMPTS_PER_LEASE = 1024
WARNING_INTERVAL_S = 10.0  # at most one warning about re-registrations per interval
MALFORMED_HEADER_LOG_S = 60.0  # at most one warning about malformed credential headers per actor id
NOT_ENROLLED_LOG_S = 60.0  # at most one warning about refused registrations (retired, or not enrolled)
BUSY_LOG_S = 60.0  # at most one warning per full pool (an actor's slots, or the unverified callers')


# How a refusal raised inside an RPC is answered, and the counter it adds to (first match wins).
REFUSALS: tuple[tuple[type[Exception], grpc.StatusCode, str | None], ...] = (
    (UnknownWeightVersion, grpc.StatusCode.INVALID_ARGUMENT, "weight_reports_refused"),
    (InvalidInput, grpc.StatusCode.INVALID_ARGUMENT, "requests_invalid"),
    (UnknownCredential, grpc.StatusCode.UNAUTHENTICATED, "credentials_refused"),
    (CredentialRefused, grpc.StatusCode.PERMISSION_DENIED, "credentials_refused"),
    (AtCapacity, grpc.StatusCode.RESOURCE_EXHAUSTED, "calls_refused_busy"),
    (RegistryFull, grpc.StatusCode.RESOURCE_EXHAUSTED, "calls_refused_busy"),
    (WeightsNotHeld, grpc.StatusCode.NOT_FOUND, None),
)


def served(method: Callable) -> Callable:
    """Wraps an RPC method: a refusal it raises (REFUSALS) is answered with its status and counted;
    anything else is logged with its traceback, counted as an internal error and answered INTERNAL."""
    if inspect.isgeneratorfunction(method):

        @functools.wraps(method)
        def streaming(self: LearnerService, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
            try:
                yield from method(self, request, context)
            except Exception as error:
                self._refuse(context, method.__name__, error)

        return streaming

    @functools.wraps(method)
    def unary(self: LearnerService, request: Any, context: grpc.ServicerContext) -> Any:
        try:
            with self._unary_slot(request, context):
                return method(self, request, context)
        except Exception as error:
            self._refuse(context, method.__name__, error)

    return unary


class LearnerService(rpc.LearnerServicer):
    """gRPC servicer of tandem's Learner service plus the trainer-facing API."""

    def __init__(self, prompts: PromptSource, config: ServiceConfig, *, enrollment_key: bytes | None = None) -> None:
        """`enrollment_key`: the run's (tandem_wire/enrollment.py), shared with its fleet; None makes a
        random one that nobody else holds, so only `server.open_enrollment` admits actors."""
        self.config = cfg = config
        self._prompts = prompts
        prompts.limit_leases(cfg.prompts_per_step, cfg.admission.max_staleness)
        self._pace = StepPace(time.monotonic())
        self._cond = threading.Condition(threading.RLock())
        self._accounting = Accounting()
        # Versions, and the transports that answer each fetch (learner/weights/desk.py).
        self._desk = WeightDesk(cfg, self._accounting.add)
        self._progress = Progress()  # the step, the newest version and when each was published
        self._minter = CredentialMinter()  # read without the lock by _vouched_for: its key never changes
        self._registry = ActorRegistry(cfg.max_actors, cfg.admission.actor_timeout_s, minter=self._minter)
        # Admission, the queue and the acks (learner/service/group_desk.py).
        self._groups = GroupDesk(cfg, self._cond, self._progress, prompts, self._registry, self._accounting)
        self._enrollment = EnrollmentGate(enrollment_key, cfg.server.open_enrollment)
        self._group_streams = CallSlots("group streams", cfg.max_streams, cfg.max_streams_per_actor)
        self._weight_streams = CallSlots("weight streams", cfg.max_weight_streams, cfg.max_weight_streams_per_actor,
                                         anonymous=cfg.max_anonymous_weight_streams)
        self._unary_calls = CallSlots("unary calls", workers(cfg), cfg.unary_calls_per_actor,
                                      anonymous=cfg.unverified_unary_calls)
        self._status = SharedReply(self._status_reply, cfg.status_workers)
        self._reaper = IdleReaper(cfg.stream_idle_timeout_s, self._reaped)
        self._reregister_log = KeyedThrottle(WARNING_INTERVAL_S)
        self._malformed_log = KeyedThrottle(MALFORMED_HEADER_LOG_S)
        self._not_enrolled_log = KeyedThrottle(NOT_ENROLLED_LOG_S)
        self._busy_log = KeyedThrottle(BUSY_LOG_S)
        self._server: grpc.Server | None = None

    # ================================================================== lifecycle

    def start(self, address: str = "127.0.0.1:0") -> str:
        """Serve on `address` (port 0 = any free port); returns "host:port"."""
        if self._server is not None:
            raise RuntimeError("service already started")
        cfg = self.config
        server = grpc.server(
            ThreadPoolExecutor(max_workers=workers(cfg), thread_name_prefix="tandem-learner"),
            options=server_options(cfg),
            interceptors=[BearerTokenInterceptor(cfg.server.auth_token)] if cfg.server.auth_token else [],
        )
        add_tolerant_learner_servicer(self, server)
        if cfg.server.tls_cert_path or cfg.server.tls_key_path:
            if not (cfg.server.tls_cert_path and cfg.server.tls_key_path):
                raise ValueError("TLS needs both tls_cert_path and tls_key_path")
            credentials = grpc.ssl_server_credentials(
                [(Path(cfg.server.tls_key_path).read_bytes(), Path(cfg.server.tls_cert_path).read_bytes())]
            )
            port = server.add_secure_port(address, credentials)
        else:
            port = server.add_insecure_port(address)
        server.start()
        self._reaper.start()
        self._server = server
        return f"{address.rsplit(':', 1)[0]}:{port}"

    def stop(self, grace: float | None = 1.0) -> None:
        """Stop serving; pending next_batch calls return what they have."""
        if self._server is not None:
            self._server.stop(grace).wait()
        self._reaper.stop()
        with self._cond:
            self._groups.close()
            self._desk.close()

    # ================================================================== trainer-facing API

    def next_batch(self, num_groups: int, timeout: float | None = None) -> list[GroupRecord]:
        """Block until `num_groups` fresh groups are queued (or `timeout` passes / the service stops) and
        hand them out, oldest policy version first (learner/service/group_desk.py: GroupDesk.next_batch)."""
        return self._groups.next_batch(num_groups, timeout)

    def mark_consumed(self, group_ids: Iterable[str], *, trained: bool = True) -> None:
        """Retire groups next_batch handed out, trained or (not `trained`) for lack of signal, and tell their
        actors (GroupDesk.mark_consumed)."""
        self._groups.mark_consumed(group_ids, trained=trained)

    def publish_weights(self, version: int, tensors: Iterable[tuple[str, np.ndarray]],
                        adapter: Mapping[str, Any] | None = None) -> None:
        """Serialise, checksum and publish a weight version; actors see it in acks and heartbeats.

        `tensors`: HF-named full weights, or with `adapter` (the adapters' adapter_config.json,
        models.peft.adapter_config) the LoRA adapters in PEFT's names and shapes (models.peft.adapter_shapes),
        which actors serve over the base they started from (an ADAPTER version); float32, bfloat16 or
        float16. Versions increase; the version restored by load_state_dict may be published once more.
        Version 0 is the base itself, which no actor fetches: as an adapter it must be the zero update."""
        with self._cond:
            self._check_publishable(version)
        weights = self._desk.pack(version, tensors, adapter)
        with self._cond:
            try:
                self._check_publishable(version)
            except ValueError:
                self._desk.discard(weights)
                raise
            self._desk.publish(weights)
            self._progress.latest_version = version
            self._progress.version_steps[version] = self._progress.step
            self._groups.announce()  # an actor waiting for budget loads it now

    def set_step(self, step: int) -> None:
        """The learner has completed `step` steps: the lease budget grows to match."""
        with self._cond:
            if step != self._progress.step:
                self._pace.stepped(time.monotonic())
                self._progress.step = step
                self._groups.announce()

    @property
    def latest_version(self) -> int:
        with self._cond:
            return self._progress.latest_version

    def accounting(self) -> dict[str, int]:
        """All counters (see learner/service/accounting.py for the invariants they satisfy)."""
        with self._cond:
            counts = self._accounting.snapshot()
            counts.update(self._prompts.counts())
            counts["groups_in_queue"] = self._groups.queue.depth
            counts["groups_in_batch"] = self._groups.queue.in_batch
            counts["tokens_in_queue"] = self._groups.queue.tokens_in_queue
            counts["tokens_in_batch"] = self._groups.queue.tokens_in_batch
            counts["groups_stale"] = counts["groups_stale_on_arrival"] + counts["groups_stale_at_dequeue"]
            return counts

    def stale_report(self) -> dict[str, Any]:
        """Why groups were dropped as stale in this process: counts by cause and the latest few
        (learner/service/stale_log.py)."""
        with self._cond:
            return {**self._groups.stale.report(), "late_group_wait": self._groups.late.report()}

    def queue_depth(self) -> int:
        with self._cond:
            return self._groups.queue.depth

    def retire(self, actor_ids: Iterable[str]) -> None:
        """The fleet replaced or removed these actors: their ids are refused from now on (Register, and
        every call or stream of a registration they still hold)."""
        with self._cond:
            retired = self._enrollment.retire(actor_ids)
            for actor_id in retired:
                self._registry.forget(actor_id)
        if retired:
            log.info("retired actor ids %s: refused from now on", retired)

    def actors_status(self) -> list[ActorRecord]:
        """Every registered actor; `stale` ones have not been heard from for actor_timeout_s."""
        with self._cond:
            return self._registry.records()

    def waiting_report(self) -> str:
        """Why no group may be coming, in one line per actor: the version it serves against the
        newest, the lease slots its version still allows, and its last weight report (an actor that
        cannot load the newest version and is more than max_staleness behind gets no lease)."""
        with self._cond:
            lines = [f"learner step {self._progress.step}, newest version {self._progress.latest_version}, "
                     f"lease slots in use {self._prompts.counts()['lease_slots_in_use']}, "
                     f"groups in queue {self._groups.queue.depth}"]
            for actor in self._registry.records():
                report = actor.last_weight_report or {}
                last = (f"v{report.get('version')} {'applied' if report.get('applied') else 'NOT applied'}"
                        f" {str(report.get('detail', ''))[:120]}".rstrip()) if report else "none"
                lines.append(f"  {actor.actor_id}: serves v{actor.weight_version}, may lease "
                             f"{self._prompts.allowance(self._groups.budget_step(actor))}, "
                             f"{'silent' if actor.stale else 'alive'}, last weight report: {last}")
        return "\n".join(lines)

    def state_dict(self) -> dict[str, Any]:
        """JSON-serialisable exactly-once state for the checkpoint (prompts, counters, versions)."""
        with self._cond:
            return {
                "format": STATE_FORMAT,
                "step": self._progress.step,
                "latest_version": self._progress.latest_version,
                "prompts": self._prompts.state_dict(),
                "accounting": self._accounting.snapshot(),
                "unconsumed_groups": self._groups.queue.depth + self._groups.queue.in_batch,
                "unconsumed_tokens": self._groups.queue.tokens_in_queue + self._groups.queue.tokens_in_batch,
            }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a state_dict() before start(); queued groups of the old run are forgotten (their
        actors send them again) and counted as groups_forgotten_on_restart."""
        if state.get("format") != STATE_FORMAT:
            raise ValueError(f"unsupported service state format {state.get('format')!r}")
        with self._cond:
            if self._server is not None:
                raise RuntimeError("load_state_dict must be called before start()")
            self._prompts.load_state_dict(state["prompts"], lease_seconds=self.config.admission.lease_seconds)
            self._accounting.load(state["accounting"])
            self._accounting.add_all({"groups_forgotten_on_restart": int(state["unconsumed_groups"]),
                                      "tokens_forgotten_on_restart": int(state.get("unconsumed_tokens", 0))})
            self._progress.step = int(state["step"])
            self._progress.latest_version = int(state["latest_version"])
            self._desk.versions.restored(self._progress.latest_version)

    # ================================================================== RPCs

    @served
    def Register(self, request: pb.RegisterRequest, context: grpc.ServicerContext) -> pb.RegisterReply:
        actor_id = request_checks.caller(_decoded(request))
        capabilities = request_checks.capabilities(request.capabilities)
        version = request_checks.served_version(request.weight_version)
        with self._cond:
            self._enrollment.admit(actor_id, _header(context, ENROLLMENT_METADATA_KEY))
            registration = self._registry.register(actor_id, capabilities, self._desk.versions.served(version),
                                                   _header(context, CREDENTIAL_METADATA_KEY))
            if registration.superseded_seen_s is not None:
                self._accounting.add("actors_superseded")
                # at most one warning per interval (a hostile client must not flood the log; the counter counts all)
                log.log(logging.WARNING if self._reregister_log.allow(None) else logging.DEBUG,
                        "actor %r registered again without its credential; its previous registration (heard from "
                        "%.1f s ago) is revoked: a restarted actor, or a client claiming its id", actor_id,
                        registration.superseded_seen_s)
            return pb.RegisterReply(
                latest_version=self._progress.latest_version,
                heartbeat_interval_ms=int(self.config.admission.heartbeat_interval_s * 1000),
                credits=self._groups.credits(actor_id),
                max_staleness=self.config.admission.max_staleness,
                credential=registration.credential,
            )

    @served
    def Heartbeat(self, request: pb.HeartbeatRequest, context: grpc.ServicerContext) -> pb.HeartbeatReply:
        actor_id = request_checks.caller(_decoded(request))
        version, in_flight, tokens_per_second, shares = request_checks.heartbeat(request)
        with self._cond:
            actor = self._caller(context, actor_id)
            actor.weight_version = self._desk.versions.served(version)
            actor.groups_in_flight, actor.tokens_per_second = in_flight, tokens_per_second
            actor.time_shares = shares
            return pb.HeartbeatReply(latest_version=self._progress.latest_version)

    @served
    def LeasePrompts(
        self, request: pb.LeasePromptsRequest, context: grpc.ServicerContext
    ) -> pb.LeasePromptsReply:
        actor_id = request_checks.caller(_decoded(request))
        max_prompts = min(check_int("max_prompts", request.max_prompts, 0), MAX_PROMPTS_PER_LEASE)
        with self._cond:
            actor = self._caller(context, actor_id)
            report = actor.last_weight_report or {}
            refused_newest = report.get("version") == self._progress.latest_version and not report.get("applied")
            ask = LeaseAsk(max_prompts, self._progress.step, self._groups.budget_step(actor),
                           self.config.admission.max_staleness, refused_newest)
            leased = self._prompts.lease(actor.holder, max_prompts, self.config.admission.lease_seconds,
                                         ask.budget_step) if may_lease(ask) else []
            exhausted = self._prompts.exhausted()
            decision = decide_lease(ask, LeaseOutcome(
                granted=len(leased), exhausted=exhausted, allowance=self._prompts.allowance(ask.budget_step),
                allowance_now=self._prompts.allowance(self._progress.step),
                step_due_in_s=self._pace.retry_after(time.monotonic())))
            latest_version = self._progress.latest_version
        return pb.LeasePromptsReply(
            prompts=[
                pb.Prompt(group_id=p.group_id, token_ids=p.prompt_ids, text=p.text, metadata=p.metadata)
                for p in leased
            ],
            exhausted=exhausted,
            lease_seconds=self.config.admission.lease_seconds,
            retry_after_seconds=decision.retry_after_s,
            latest_version=latest_version,
        )

    @served
    def StreamGroups(
        self, request_iterator: Iterator[pb.ScoredGroup], context: grpc.ServicerContext
    ) -> Iterator[pb.GroupAck]:
        """Acks for the groups read (by a helper thread) plus CONSUMED/STALE acks sent later."""
        with self._cond:
            actor = self._registry.authenticate(_header(context, CREDENTIAL_METADATA_KEY))
            actor_id, incarnation = actor.actor_id, actor.incarnation
        what = f"group stream of {actor_id!r}"
        with self._group_streams.hold(actor_id), self._reaper.watch(what, context.cancel) as progress:
            stream = GroupStream(actor_id, progress)
            admit = functools.partial(self._groups.admit, actor_id, incarnation)
            yield from stream.serve(request_iterator, context, admit, self._groups.stream_ended)

    @served
    def FetchWeights(self, request: pb.FetchWeightsRequest, context: grpc.ServicerContext) -> Iterator[bytes]:
        actor_id = request_checks.caller(_decoded(request))
        version = check_int("version", request.version, 0)
        fetch = self._desk.fetch(actor_id, request, _header(context, OFFERS_METADATA_KEY))
        what = f"weight stream of {actor_id!r}"
        with self._weight_streams.hold(self._vouched_for(request, context)), \
                self._reaper.watch(what, context.cancel) as progress, \
                self._desk.answer(version, fetch) as (transport, messages):  # serialised once at publish time
            context.send_initial_metadata(((ANSWER_METADATA_KEY, transport.source),))
            for message in messages:
                yield message
                self._accounting.add("weight_bytes_streamed", len(message))
                progress.touch()

    @served
    def ReportWeights(self, request: pb.WeightReport, context: grpc.ServicerContext) -> pb.WeightReportReply:
        actor_id = request_checks.actor_id(_decoded(request).actor_id)
        report = request_checks.weight_report(request)
        with self._cond:
            actor = self._caller(context, actor_id)
            self._desk.versions.check_reported(request.version)
            actor.last_weight_report = report
            if request.applied:
                actor.weight_version = request.version
        return pb.WeightReportReply()

    @served
    def Status(self, request: pb.StatusRequest, context: grpc.ServicerContext) -> pb.StatusReply:
        _decoded(request)
        return self._status.read()  # served apart: see _unary_slot

    def _status_reply(self) -> pb.StatusReply:
        """What Status answers, read under the service's lock."""
        counts = self.accounting()
        with self._cond:
            return pb.StatusReply(
                step=self._progress.step,
                weight_version=self._progress.latest_version,
                queue_depth=self._groups.queue.depth,
                queue_capacity=self._groups.queue.capacity,
                actors=[
                    pb.ActorStatus(
                        actor_id=a.actor_id,
                        weight_version=a.weight_version,
                        seconds_since_heartbeat=a.seconds_since_heartbeat,
                        groups_in_flight=a.groups_in_flight,
                        tokens_per_second=a.tokens_per_second,
                        time_shares=pb.TimeShares(**dataclasses.asdict(a.time_shares)),
                    )
                    for a in self._registry.records()
                ],
                accounting=pb.Accounting(
                    **{k: v for k, v in counts.items() if k in pb.Accounting.DESCRIPTOR.fields_by_name}
                ),
                mode=self.config.mode,
            )

    def _vouched_for(self, request: Any, context: grpc.ServicerContext) -> str | None:
        """The actor id the call names when the call proves it may speak for it: a credential this learner
        minted for that id or, on Register, the enrollment token the run's fleet minted for it. Else None:
        the call counts among the unverified ones, whatever id it names. One or two HMACs over bounded
        input, compared in constant time, reading no state that changes (so no lock): it runs before the
        call takes a slot. Whether the registration is still current is the method's check, later."""
        actor_id = getattr(request, "actor_id", "")  # none on Status, nor on bytes that did not parse
        if not isinstance(actor_id, str) or not 0 < len(actor_id) <= MAX_ID_CHARS:
            return None
        if self._minter.verify(actor_id, _header(context, CREDENTIAL_METADATA_KEY)):
            return actor_id
        if isinstance(request, pb.RegisterRequest) and self._enrollment.vouches(
                actor_id, _header(context, ENROLLMENT_METADATA_KEY)):
            return actor_id
        return None

    def _unary_slot(self, request: Any, context: grpc.ServicerContext) -> contextlib.AbstractContextManager:
        """The slot a unary call holds while it runs: one of the actor it proves it speaks for, or one of
        the pool of calls that prove no identity. Status holds none: SharedReply bounds its builders."""
        if isinstance(request, pb.StatusRequest):
            return contextlib.nullcontext()
        return self._unary_calls.hold(self._vouched_for(request, context))

    def _caller(self, context: grpc.ServicerContext, actor_id: str) -> ActorRecord:
        """The registered actor the call's credential names, which must be `actor_id`; heard from now."""
        actor = self._registry.authenticate(_header(context, CREDENTIAL_METADATA_KEY), actor_id)
        self._registry.touch(actor)
        return actor

    def _refuse(self, context: grpc.ServicerContext, method: str, error: Exception) -> None:
        """End a call with the status of `error` (see REFUSALS), counting it."""
        if isinstance(error, MalformedCredential) and self._malformed_log.allow(
                (error.header, error.actor_id[:MAX_ID_CHARS])):
            log.warning("%s refused a malformed %s header (claimed actor %.64r); at most one such "
                        "warning per actor per %.0f s, credentials_refused counts them all",
                        method, error.header, error.actor_id, MALFORMED_HEADER_LOG_S)
        if isinstance(error, AtCapacity) and self._busy_log.allow(str(error)):
            log.warning("%s refused: %s; at most one such warning per pool per %.0f s, calls_refused_busy counts "
                        "them all", method, error, BUSY_LOG_S)
        if isinstance(error, NotEnrolled) and self._not_enrolled_log.allow(NotEnrolled):
            log.warning("%s refused: %.300s; at most one such warning per %.0f s, credentials_refused counts "
                        "them all", method, error, NOT_ENROLLED_LOG_S)
        for kind, code, counter in REFUSALS:
            if isinstance(error, kind):
                if counter is not None:
                    self._accounting.add(counter)
                context.abort(code, str(error)[:MAX_ACK_DETAIL_CHARS])
        log.warning("unexpected error in %s", method, exc_info=error)
        self._accounting.add("internal_errors")
        context.abort(grpc.StatusCode.INTERNAL, f"internal error: {type(error).__name__}")

    def _reaped(self, what: str) -> None:
        log.info("cancelled the %s: no progress for %.0f s", what, self.config.stream_idle_timeout_s)
        self._accounting.add("streams_idle_closed")

    def _check_publishable(self, version: int) -> None:
        held = self._desk.latest_version
        if version < self._progress.latest_version or (held is not None and version <= held):
            raise ValueError(f"weight version {version} must be newer than {self._progress.latest_version}")


def server_options(config: ServiceConfig) -> list[tuple[str, int]]:
    """The gRPC server's options for `config`."""
    # Weights go out in big chunks; groups come in and are bounded separately (hostile input).
    options = dict(grpc_options())
    options["grpc.max_receive_message_length"] = config.max_group_bytes
    options.update(
        {
            "grpc.so_reuseport": 0,  # a second learner on the same port must fail, not share it
            # Clients ping every keepalive_time_ms even when idle; do not punish them for it.
            "grpc.http2.min_recv_ping_interval_without_data_ms": 10_000,
            "grpc.http2.max_ping_strikes": 0,
            # One bound for request headers, not gRPC's default band (8-16 KiB) in which it refuses
            # at random: a header set either fits or is refused RESOURCE_EXHAUSTED, every time.
            "grpc.max_metadata_size": MAX_METADATA_BYTES,
            "grpc.absolute_max_metadata_size": MAX_METADATA_BYTES,
        }
    )
    return list(options.items())


def workers(cfg: ServiceConfig) -> int:
    """The server's thread pool: every long call's cap plus the unary, unverified and Status workers."""
    return (cfg.max_streams + cfg.max_weight_streams + cfg.unary_workers + cfg.unverified_unary_calls
            + cfg.status_workers)


def _decoded(request: Any) -> Any:
    """The request, unless its bytes did not parse."""
    if isinstance(request, Undecodable):
        raise InvalidInput(request.error)
    return request


def _header(context: grpc.ServicerContext, name: str) -> str | None:
    """The call's metadata `name` (tandem-credential, tandem-enrollment), if any."""
    for key, value in context.invocation_metadata() or ():
        if key == name:
            return value if isinstance(value, str) else None
    return None

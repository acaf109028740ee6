"""Actor-side client of the learner's gRPC service (tandem_wire `Learner`).

Groups: `send_group` puts a ScoredGroup in the client's outbox (actors/outbox.py, which states the
protocol: final and non-final acks, credits and probes, re-sending after a reconnect) and hands it
to a background thread that owns one bidirectional StreamGroups call; the outbox decides what that
call sends and when. When the stream breaks (learner restarted, network), the thread re-registers
and opens a new stream, on which the outbox re-sends every unacked group in order. `send_group`
blocks while the backlog exceeds the credits, so an actor never holds more than a few groups
beyond what the learner has queued for it.

Weights: `fetch_weights` stages a whole version and verifies it, by the transports this actor can use
(actors/weights/fetcher.py: an actor on the learner's host gets the blob from a shared file, one off it
maybe from another actor's relay; any failure of those is retried once over the learner's stream of
chunks). The client only opens the calls, with its identity.

Identity: `register` presents the enrollment token the fleet minted for this actor id (tandem_wire/
enrollment.py; sent to the learner only, never to a relay peer) and returns this actor's own credential
from the learner; the client attaches it to
every later call (next to the run's shared token, when one is set) and registers again when a call is
refused UNAUTHENTICATED (a restarted learner, or an expired registration), presenting the credential
it holds so that the learner renews it rather than starting a new incarnation. A client whose
registration was superseded by another client of the same actor id (PERMISSION_DENIED) does not take
the id back: its calls fail and its group stream closes the client.

A busy learner: a call refused RESOURCE_EXHAUSTED (a pool of the learner's is full) or UNAVAILABLE is
tried again after a jittered back-off (RETRY_BACKOFF_S), up to RETRY_BACKOFF_S's length and within the
call's deadline; every such refusal is counted (`calls_refused`) and logged at most once a minute per
method and code. A unary call still refused then raises LearnerBusy (RESOURCE_EXHAUSTED) or
LearnerUnavailable, which a rollout actor's loops ride out: they ask again later. The group stream
reconnects after any break, with the same jitter. FetchWeights retries RESOURCE_EXHAUSTED only: a learner
that is down fails a fetch at once, and the old weights keep serving.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc

from actors.learner_replies import LearnerBusy, LearnerUnavailable, LeaseReply, Prompt, RegisterInfo
from actors.outbox import PROBE_DELAY_S, Outbox, Send
from actors.weights.fetcher import WeightFetcher
from actors.weights.relay import WeightRelayServer
from actors.weights.staged import StagedWeights, WeightTransferError
from tandem_wire import WIRE_VERSION, grpc_options, pb, rpc
from tandem_wire.auth import AUTH_METADATA_KEY, bearer
from tandem_wire.limits import CREDENTIAL_METADATA_KEY, ENROLLMENT_METADATA_KEY, MAX_DETAIL_CHARS
from tandem_wire.log_throttle import KeyedThrottle

__all__ = [
    "LearnerClient",
    "RegisterInfo",
    "Prompt",
    "LeaseReply",
    "LearnerUnavailable",
    "LearnerBusy",
    "StagedWeights",
    "WeightTransferError",
]

log = logging.getLogger(__name__)

RENEW_ATTEMPTS = 3  # calls refused UNAUTHENTICATED and renewed before the last try
# A group stream ending with one of these is routine (an idle stream cancelled, a registration the learner
# no longer knows): reconnect quietly.
EXPECTED_STREAM_ENDS = (grpc.StatusCode.CANCELLED, grpc.StatusCode.UNAUTHENTICATED)
# A call ending with one of these (the learner busy, or restarting) is counted and tried again.
RETRIED_CODES = (grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.UNAVAILABLE)
RETRY_BACKOFF_S = (0.05, 0.1, 0.2, 0.4, 0.8)  # before each retry of a refused call; each scaled by 0.5-1
REFUSAL_LOG_S = 60.0  # at most one warning per method and code of refusal
CLIENT_CHANNEL_OPTIONS = [  # reconnect quickly after a learner restart (gRPC's default is up to 120 s)
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 2000),
]


class LearnerClient:
    """One actor's connection to the learner. Thread-safe."""

    def __init__(
        self,
        address: str,
        actor_id: str,
        auth_token: str | None = None,
        *,
        tls_ca_path: str | None = None,
        call_timeout_s: float = 30.0,
        on_announcement: Callable[[], None] | None = None,
        shared_memory: bool = True,
        relay: WeightRelayServer | None = None,
        enrollment: str | None = None,
    ) -> None:
        """`on_announcement` is called (on the stream's thread) for each announcement on the group
        stream: a new version, or a lease budget that grew, so a caller waiting for prompts asks again.
        `shared_memory`: offer this host's shared-memory domain when fetching weights (the bulk path).
        `relay`: this actor's relay server; streamed versions are relayed to the actors the learner
        sends to it, and this actor may be sent to another's (actors/weights/relay.py).
        `enrollment`: this actor id's enrollment token, from the fleet (None: a learner with
        server.open_enrollment)."""
        if not actor_id:
            raise ValueError("actor_id must be non-empty")
        self.address = address
        self.actor_id = actor_id
        self._call_timeout_s = call_timeout_s
        self._on_announcement = on_announcement
        self._token_metadata = ((AUTH_METADATA_KEY, bearer(auth_token)),) if auth_token else ()
        self._enrollment = ((ENROLLMENT_METADATA_KEY, enrollment),) if enrollment else ()
        self._credential: str | None = None  # this actor's credential, from the last Register
        self._register_lock = threading.Lock()  # one registration at a time (renewals must not race)
        self._tls_ca_path = tls_ca_path
        self._channel = self._open_channel(address)
        self._stub = rpc.LearnerStub(self._channel)
        self._cond = threading.Condition()  # guards the outbox and the fields below
        self._outbox: Outbox[pb.ScoredGroup] = Outbox()
        self._latest_version = 0
        self._registration: tuple[dict[str, Any], int] | None = None
        self._stream_thread: threading.Thread | None = None
        self._stream_call: Any = None
        self._closed = False
        self._closed_reason = "client is closed"
        self.rejections: deque[tuple[str, str, str]] = deque(maxlen=100)  # (group_id, status, detail)
        self._weights = WeightFetcher(actor_id, self._fetch_call, self._fetch_retry, shared_memory=shared_memory,
                                      relay=relay, token_metadata=self._token_metadata)
        self.calls_refused: Counter[str] = Counter()  # "<method> <code>" -> refusals seen (each retried)
        self._refusal_log = KeyedThrottle(REFUSAL_LOG_S)

    # ================================================================== registration, prompts

    def register(self, capabilities: dict[str, Any], weight_version: int) -> RegisterInfo:
        """Announce this actor (ActorCapabilities fields) and the weight version it serves (-1 = none)."""
        with self._register_lock:
            return self._register(capabilities, weight_version, timeout=None)

    def _register(
        self, capabilities: dict[str, Any], weight_version: int, timeout: float | None
    ) -> RegisterInfo:
        """One Register call (the caller holds _register_lock), presenting the credential held."""
        request = pb.RegisterRequest(
            wire_version=WIRE_VERSION,
            actor_id=self.actor_id,
            capabilities=pb.ActorCapabilities(**capabilities),
            weight_version=weight_version,
        )
        reply = self._call("Register", request, timeout, self._current_credential())
        with self._cond:
            self._registration = (dict(capabilities), weight_version)
            self._credential = reply.credential or None
            self._outbox.set_credits(reply.credits)
            self._latest_version = reply.latest_version
            self._cond.notify_all()
        return RegisterInfo(
            reply.latest_version, reply.heartbeat_interval_ms / 1000.0, reply.credits, reply.max_staleness
        )

    def _renew(self, failed: str | None, timeout: float | None = None) -> bool:
        """Register again after `failed` (the credential a call presented) was refused; False when
        there is no registration to repeat. Skipped when another thread already renewed it."""
        with self._register_lock:
            with self._cond:
                registration, current = self._registration, self._credential
            if registration is None:
                return False
            if current == failed:
                self._register(*registration, timeout=timeout)
            return True

    def heartbeat(
        self, weight_version: int, groups_in_flight: int = 0, tokens_per_second: float = 0.0,
        time_shares: dict[str, float] | None = None,
    ) -> int:
        """Report liveness (and where our time went since the last heartbeat, pb.TimeShares' fields);
        returns the latest published version."""
        reply = self._unary(
            "Heartbeat",
            pb.HeartbeatRequest(
                wire_version=WIRE_VERSION,
                actor_id=self.actor_id,
                weight_version=weight_version,
                groups_in_flight=groups_in_flight,
                tokens_per_second=tokens_per_second,
                time_shares=pb.TimeShares(**(time_shares or {})),
            ),
        )
        with self._cond:
            self._latest_version = reply.latest_version
        return reply.latest_version

    def lease_prompts(self, max_prompts: int) -> LeaseReply:
        """Up to `max_prompts` prompts to sample, whether the dataset is exhausted, and when to ask
        again if the learner's lease budget held prompts back."""
        request = pb.LeasePromptsRequest(
            wire_version=WIRE_VERSION, actor_id=self.actor_id, max_prompts=max_prompts
        )
        reply = self._unary("LeasePrompts", request)
        with self._cond:
            self._latest_version = reply.latest_version  # the weights thread loads a newer one at once
        leases = [Prompt(list(p.token_ids), p.text, dict(p.metadata), group_id=p.group_id) for p in reply.prompts]
        return LeaseReply(leases, reply.exhausted, reply.retry_after_seconds)

    # ================================================================== groups

    def send_group(self, group: pb.ScoredGroup, timeout: float | None = None) -> None:
        """Queue a group for the background stream. Blocks only while the backlog exceeds the
        credits; on `timeout` raises TimeoutError (the group stays queued and will be sent).
        Fills in actor_id and wire_version when unset."""
        if not group.group_id:
            raise ValueError("group_id must be non-empty")
        if not group.actor_id:
            group.actor_id = self.actor_id
        elif group.actor_id != self.actor_id:
            raise ValueError(f"group from actor {group.actor_id!r} sent by client {self.actor_id!r}")
        if not group.wire_version:
            group.wire_version = WIRE_VERSION
        with self._cond:
            if self._closed:
                raise RuntimeError(self._closed_reason)
            self._outbox.add(group.group_id, group)
            if self._stream_thread is None:
                self._stream_thread = threading.Thread(
                    target=self._stream_loop, name="tandem-group-stream", daemon=True
                )
                self._stream_thread.start()
            self._cond.notify_all()
            if not self._cond.wait_for(self._backlog_fits, timeout):
                raise TimeoutError(f"no credits from the learner within {timeout} s")

    def wait_for_credits(self, timeout: float | None = None) -> bool:
        """Wait until the groups sent fit the learner's credits again (or the client is closed); False
        on timeout."""
        with self._cond:
            return self._cond.wait_for(self._backlog_fits, timeout)

    def unacked_count(self) -> int:
        with self._cond:
            return self._outbox.unacked_count()

    def is_unacked(self, group_id: str) -> bool:
        """Whether a group with this id was submitted and has no final ack yet."""
        with self._cond:
            return self._outbox.is_unacked(group_id)

    def wait_for_final_ack(self, group_id: str, timeout: float) -> bool:
        """Wait up to `timeout` for a submitted group's final ack; True when it has none left to wait
        for (acked, never submitted, or the client closed)."""
        with self._cond:
            return self._cond.wait_for(lambda: self._closed or not self._outbox.is_unacked(group_id), timeout)

    def drain(self, timeout: float | None = None) -> bool:
        """Wait until every sent group got a final ack (CONSUMED/DUPLICATE/STALE/INVALID)."""
        with self._cond:
            drained = self._cond.wait_for(lambda: not self._outbox.unacked_count() or self._closed, timeout)
            return drained and not self._outbox.unacked_count()

    def counts(self) -> dict[str, int]:
        """Group counts: submitted, sent, resent, queued, retry, consumed, duplicate, stale, invalid,
        reconnects, unacked (actors/outbox.py says what each counts)."""
        with self._cond:
            return self._outbox.counts()

    @property
    def latest_version(self) -> int:
        with self._cond:
            return self._latest_version

    # ================================================================== weights and status

    @property
    def weight_fetches(self) -> dict[str, int]:
        """How versions arrived (from shared memory, streamed by the learner, relayed by another actor) and
        how often each bulk transport failed."""
        return self._weights.counts

    def fetch_weights(self, version: int = 0) -> StagedWeights:
        """Download and verify a weight version (0 = the latest); raises WeightTransferError on any
        failure, in which case nothing is returned (actors/weights/fetcher.py)."""
        return self._weights.fetch(version).staged

    def _fetch_call(self, request: pb.FetchWeightsRequest, metadata: tuple[tuple[str, str], ...]) -> Any:
        """A FetchWeights call of this actor (the fetcher's `call`)."""
        request.wire_version, request.actor_id = WIRE_VERSION, self.actor_id
        return self._stub.FetchWeights(
            request, metadata=self._metadata(self._current_credential()) + metadata,
            wait_for_ready=False,  # a learner that is down fails the fetch now; the old weights keep serving
        )

    def _fetch_retry(self, error: grpc.RpcError, refusals: int) -> bool:
        """Call FetchWeights again, after a back-off, while the learner refuses it RESOURCE_EXHAUSTED (its
        weight streams are all open); the fetcher's `retry`."""
        backoff = RETRY_BACKOFF_S[refusals] if refusals < len(RETRY_BACKOFF_S) else None
        return error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and self._retry_after("FetchWeights", error, backoff)

    def report_weights(
        self, version: int, applied: bool, detail: str = "", stall_s: float = 0.0, transfer_s: float = 0.0
    ) -> bool:
        """Tell the learner whether `version` was applied (a long `detail` is cut to the learner's
        bound). Returns False, without raising, when the learner refuses the report: a learner that
        restarted since the fetch never published that version, and a report is only telemetry."""
        report = pb.WeightReport(
            actor_id=self.actor_id,
            version=version,
            applied=applied,
            detail=detail[:MAX_DETAIL_CHARS],
            stall_seconds=stall_s,
            transfer_seconds=transfer_s,
        )
        try:
            self._unary("ReportWeights", report)
        except grpc.RpcError as error:
            if error.code() != grpc.StatusCode.INVALID_ARGUMENT:
                raise
            log.warning("%s: the learner refused the report on weight version %d: %s", self.actor_id, version,
                        error.details())
            return False
        return True

    def status(self) -> pb.StatusReply:
        return self._unary("Status", pb.StatusRequest())

    def close(self) -> None:
        """Stop the stream thread and close the channel; unacked groups are abandoned (their
        leases expire at the learner and the prompts are sampled again)."""
        with self._cond:
            self._closed = True
            call = self._stream_call
            self._cond.notify_all()
        if call is not None:
            call.cancel()
        if self._stream_thread is not None:
            self._stream_thread.join(timeout=10)
        self._channel.close()

    def retarget(self, address: str) -> None:
        """Talk to the learner at a new address (a restarted learner that bound another port): the
        group stream breaks, re-registers there and re-sends every unacked group."""
        with self._cond:
            if self._closed or address == self.address:
                return
            old_channel, self.address = self._channel, address
            self._channel = self._open_channel(address)
            self._stub = rpc.LearnerStub(self._channel)
            call = self._stream_call
            self._cond.notify_all()
        log.info("%s: learner moved to %s", self.actor_id, address)
        if call is not None:
            call.cancel()
        old_channel.close()

    def __enter__(self) -> LearnerClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ================================================================== internals

    def _open_channel(self, address: str) -> grpc.Channel:
        options = grpc_options() + CLIENT_CHANNEL_OPTIONS
        if self._tls_ca_path:
            credentials = grpc.ssl_channel_credentials(root_certificates=Path(self._tls_ca_path).read_bytes())
            return grpc.secure_channel(address, credentials, options=options)
        return grpc.insecure_channel(address, options=options)

    def _current_credential(self) -> str | None:
        with self._cond:
            return self._credential

    def _metadata(self, credential: str | None) -> tuple[tuple[str, str], ...]:
        """The shared token (when set), the enrollment token (when given; the learner reads it on Register)
        and `credential` (when held), as metadata of a call to the learner."""
        held = ((CREDENTIAL_METADATA_KEY, credential),) if credential else ()
        return self._token_metadata + self._enrollment + held

    def _unary(self, method: str, request: Any, timeout: float | None = None) -> Any:
        """One unary call with this actor's credential; refused UNAUTHENTICATED (the learner does not
        know the credential), it registers again (unless another thread did already) and repeats the
        call, up to RENEW_ATTEMPTS times: after a learner restart several threads renew at once (the
        group stream re-registers too), and each renewal revokes the credential the others just read."""
        for _ in range(RENEW_ATTEMPTS):
            credential = self._current_credential()
            try:
                return self._call(method, request, timeout, credential)
            except grpc.RpcError as error:
                if error.code() != grpc.StatusCode.UNAUTHENTICATED or not self._renew(credential, timeout):
                    raise
        return self._call(method, request, timeout, self._current_credential())

    def _call(self, method: str, request: Any, timeout: float | None, credential: str | None) -> Any:
        """One unary call, tried again after a back-off while it is refused RESOURCE_EXHAUSTED or
        UNAVAILABLE, within one deadline; ``method`` names a stub method (looked up at each try:
        ``retarget`` swaps the stub)."""
        deadline = time.monotonic() + (timeout or self._call_timeout_s)
        backoffs = iter(RETRY_BACKOFF_S)
        while True:
            try:
                return getattr(self._stub, method)(
                    request, metadata=self._metadata(credential), timeout=max(0.0, deadline - time.monotonic()),
                    wait_for_ready=True
                )
            except grpc.RpcError as error:
                code = error.code()
                if code in RETRIED_CODES and self._retry_after(method, error, next(backoffs, None), deadline):
                    continue
                where = f"learner at {self.address}: {method}: {code.name}: {error.details()}"
                if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
                    raise LearnerBusy(where, code, error.details()) from error
                # CANCELLED: the channel was closed under the call by retarget()
                if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED,
                            grpc.StatusCode.CANCELLED):
                    raise LearnerUnavailable(where) from error
                raise

    def _retry_after(self, method: str, error: grpc.RpcError, backoff_s: float | None,
                     deadline: float = float("inf")) -> bool:
        """Count and log (throttled) a refusal of `method`, then wait `backoff_s` scaled by a random 0.5-1
        (callers refused together do not come back together); False, at once, when there is no back-off
        left (None), it would pass `deadline`, or the client is closed."""
        self._note_refusal(method, error)
        if backoff_s is None:
            return False
        wait_s = backoff_s * random.uniform(0.5, 1.0)
        if time.monotonic() + wait_s >= deadline:
            return False
        with self._cond:
            return not self._cond.wait_for(lambda: self._closed, wait_s)

    def _note_refusal(self, method: str, error: grpc.RpcError) -> None:
        """Count a call that ended RESOURCE_EXHAUSTED (the learner is busy) or UNAVAILABLE (e.g. restarting);
        log it at most once a minute per method and code (a learner refusing under a flood must not flood
        this actor's log): a warning when busy."""
        key = f"{method} {error.code().name}"
        with self._cond:
            self.calls_refused[key] += 1
        busy = error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        level = (logging.WARNING if busy else logging.INFO) if self._refusal_log.allow(key) else logging.DEBUG
        log.log(level, "%s: %s to %s ended %s (%.200s); trying again after a back-off. At most one such line "
                "per %.0f s: calls_refused counts them all", self.actor_id, method, self.address, error.code().name,
                error.details(), REFUSAL_LOG_S)

    def _backlog_fits(self) -> bool:
        return self._closed or self._outbox.backlog_fits()

    def _stream_loop(self) -> None:
        """Run StreamGroups calls until close(); after a break, re-register and re-send everything."""
        backoff = PROBE_DELAY_S[0]
        while True:
            with self._cond:
                if self._closed:
                    return
                epoch = self._outbox.open_stream()
                self._cond.notify_all()
            call = self._stub.StreamGroups(
                self._requests(epoch), metadata=self._metadata(self._current_credential()), wait_for_ready=True
            )
            with self._cond:
                self._stream_call = call
            try:
                for ack in call:
                    self._on_ack(ack)
                    backoff = PROBE_DELAY_S[0]
            except grpc.RpcError as error:
                if error.code() == grpc.StatusCode.PERMISSION_DENIED:
                    self._close_superseded(error)
                    return
                if error.code() in RETRIED_CODES:
                    self._note_refusal("StreamGroups", error)
                else:
                    expected = error.code() in EXPECTED_STREAM_ENDS
                    log.log(logging.INFO if expected else logging.WARNING, "group stream to %s broke: %s %s",
                            self.address, error.code(), error.details())
            with self._cond:
                if self._closed:
                    return
                self._outbox.end_stream()  # ends this stream's request generator; counts a reconnect
                self._cond.wait(backoff * random.uniform(0.5, 1.0))
            backoff = min(2 * backoff, PROBE_DELAY_S[1])
            self._reregister()

    def _reregister(self) -> None:
        """Register again before re-sending (the learner may have restarted and forgotten us)."""
        with self._cond:
            registration = self._registration
        while registration is not None:
            try:
                with self._register_lock:
                    self._register(*registration, timeout=PROBE_DELAY_S[1])
                return
            except (LearnerUnavailable, grpc.RpcError) as error:
                if isinstance(error, grpc.RpcError) and error.code() == grpc.StatusCode.PERMISSION_DENIED:
                    self._close_superseded(error)
                    return
                log.info("re-register with %s failed: %s", self.address, error)
                with self._cond:
                    if self._closed:
                        return
                    self._cond.wait(PROBE_DELAY_S[1])

    def _close_superseded(self, error: grpc.RpcError) -> None:
        """Another client registered this actor id after us: stop, rather than take the id back."""
        log.error("%s: registration superseded by another client of the same actor id: %s", self.actor_id,
                  error.details())
        with self._cond:
            self._closed = True
            self._closed_reason = f"registration of {self.actor_id!r} superseded: {error.details()}"
            self._cond.notify_all()

    def _requests(self, epoch: int) -> Iterator[pb.ScoredGroup]:
        """The request side of one StreamGroups call: the groups the outbox sends on stream `epoch`."""
        while True:
            with self._cond:
                send = self._next_send(epoch)
                if send is None:
                    return
                self._cond.notify_all()
            yield send.group

    def _next_send(self, epoch: int) -> Send[pb.ScoredGroup] | None:
        """Wait (holding _cond) for the outbox's next group on stream `epoch`; None once that stream is over."""
        while not self._closed and self._outbox.is_current(epoch):
            step = self._outbox.next_send(time.monotonic())
            if isinstance(step, Send):
                return step
            self._cond.wait(step.seconds)
        return None

    def _on_ack(self, ack: pb.GroupAck) -> None:
        with self._cond:
            self._latest_version = ack.latest_version
            final = self._outbox.record_ack(ack.group_id, ack.status, ack.credits)
            if final in ("stale", "invalid"):
                self.rejections.append((ack.group_id, final, ack.detail))
                log.debug("group %s %s: %s", ack.group_id, final, ack.detail)  # counted; the learner logs it too
            self._cond.notify_all()
        if not ack.group_id and self._on_announcement is not None:
            self._on_announcement()

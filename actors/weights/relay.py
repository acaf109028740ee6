"""An actor's weight relay: it forwards the version it is fetching to the actors the learner sends to it
(the relay transport's actor half, tandem_wire/weights/transports.py).

Why: an actor off the learner's host streams each version over gRPC; if every actor pulled from the
learner, the learner's egress would be N versions per publish. Instead the learner (learner/weights/
relay.py) sends later fetchers to an actor already fetching the version, and this server
forwards that actor's chunks *as they land* (pipelined: a chain of relays costs a few chunk times,
not a copy each). The fetching side (`relay_chunks`) takes only chunks from a relay; the header and
commit come from the learner, so a relay that sends wrong, short or no bytes makes the fetch fail
(the actor then streams from the learner) and never changes what is applied.

Bounds, since a relay's callers are other actors: each call needs the run's token; at most
`max_streams` calls at once (RESOURCE_EXHAUSTED beyond); a call ends after `stream_timeout_s` however
slowly its reader reads; bytes that stop landing for `stall_timeout_s` end it with an error. Only the
newest version this actor fetched over the stream is relayed (one extra reference to its buffer until
the next version). Plaintext: actors of a TLS learner do not relay (launch/ leaves it off).
"""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import grpc
import numpy as np

from actors.weights.halves import ActorHalf
from actors.weights.staged import StagingWatcher, WeightTransferError
from tandem_wire import WIRE_VERSION, grpc_options, pb, rpc
from tandem_wire.auth import BearerTokenInterceptor
from tandem_wire.idle import IdleReaper
from tandem_wire.weights.chunks import WEIGHT_CHUNK_BYTES, encode_chunk

log = logging.getLogger(__name__)


class RelayFailed(WeightTransferError):
    """The blob from a relaying actor did not arrive whole and intact; the learner's stream is next."""


class RelayedBlob:
    """One version as it is staged (actors.weights.staged.StagingWatcher), readable while its chunks land."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self.version = -1  # known once the first chunk lands
        self._total = 0
        self._buffer: np.ndarray | None = None
        self._landed = 0
        self._outcome: bool | None = None  # None while staging; True verified, False failed

    def landed(self, header: pb.WeightHeader, buffer: np.ndarray, end: int) -> None:
        with self._cond:
            self.version, self._total, self._buffer, self._landed = header.version, header.total_bytes, buffer, end
            self._cond.notify_all()

    def finished(self, ok: bool) -> None:
        with self._cond:
            self._outcome = ok
            self._cond.notify_all()

    def wait_for_version(self, timeout_s: float) -> int:
        """The version being staged, once its first chunk landed (-1: none within `timeout_s`, or failed)."""
        with self._cond:
            self._cond.wait_for(lambda: self.version >= 0 or self._outcome is not None, timeout_s)
            return self.version

    def chunks(self, chunk_bytes: int, stall_timeout_s: float) -> Iterator[bytes]:
        """The serialised chunk messages of the whole blob, each as soon as its bytes landed."""
        offset = 0
        while offset < self._total:
            with self._cond:
                if not self._cond.wait_for(lambda at=offset: self._landed > at or self._outcome is False,
                                           stall_timeout_s):
                    raise RelayFailed(f"no bytes landed for {stall_timeout_s:g} s at offset {offset}")
                if self._outcome is False:
                    raise RelayFailed(f"this actor's own fetch of version {self.version} failed")
                end = min(self._landed, offset + chunk_bytes)
                view = memoryview(self._buffer)[offset:end]
            yield encode_chunk(self.version, offset, view)
            offset = end


class WeightRelayServer:
    """The gRPC WeightRelay service of one actor (see the module docstring). Thread-safe."""

    def __init__(self, auth_token: str | None, bind: str = "127.0.0.1:0", advertise_host: str | None = None, *,
                 max_streams: int = 4, stream_timeout_s: float = 600.0, stall_timeout_s: float = 30.0,
                 chunk_bytes: int = WEIGHT_CHUNK_BYTES) -> None:
        """Serves on `bind` ("host:port", port 0 = any free one); other actors dial
        `advertise_host` (default: the bind host) at that port."""
        self._lock = threading.Lock()
        self._blob: RelayedBlob | None = None
        self.stream_timeout_s = stream_timeout_s  # also the bounds this actor's fetches from relays keep:
        self.stall_timeout_s = stall_timeout_s
        # a fetch from another actor's relay that receives nothing for stall_timeout_s is cancelled
        self.reaper = IdleReaper(stall_timeout_s, lambda what: log.warning("cancelled, idle: %s", what))
        self.reaper.start()
        self._chunk_bytes = chunk_bytes
        self.bytes_served = 0
        self.streams_served = 0
        self._server = grpc.server(
            ThreadPoolExecutor(max_workers=max_streams, thread_name_prefix="tandem-relay"),
            options=grpc_options(), maximum_concurrent_rpcs=max_streams,
            interceptors=[BearerTokenInterceptor(auth_token)] if auth_token else [],
        )
        handler = grpc.unary_stream_rpc_method_handler(
            self._relay_weights, request_deserializer=_parse_request, response_serializer=lambda data: data)
        service = pb.DESCRIPTOR.services_by_name["WeightRelay"].full_name
        self._server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(service, {"RelayWeights": handler}),))
        host = bind.rsplit(":", 1)[0]
        port = self._server.add_insecure_port(bind)
        self._server.start()
        self.address = f"{advertise_host or host}:{port}"

    def staging(self) -> RelayedBlob:
        """A new blob to stage the next fetched version into; from now on it is the one relayed."""
        blob = RelayedBlob()
        with self._lock:
            self._blob = blob
        return blob

    def stop(self, grace: float | None = 0.5) -> None:
        self._server.stop(grace).wait()
        self.reaper.stop()

    def _relay_weights(self, request: pb.RelayRequest, context: grpc.ServicerContext) -> Iterator[bytes]:
        if request.wire_version != WIRE_VERSION or request.version < 1:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "expected a RelayRequest of this wire version")
        with self._lock:
            blob = self._blob
        if blob is None or blob.wait_for_version(self.stall_timeout_s) != request.version:
            context.abort(grpc.StatusCode.NOT_FOUND, f"version {request.version} is not being relayed here")
        timer = threading.Timer(self.stream_timeout_s, context.cancel)  # a reader too slow to finish
        timer.start()
        try:
            for message in blob.chunks(self._chunk_bytes, self.stall_timeout_s):
                yield message
                with self._lock:
                    self.bytes_served += len(message)
        except RelayFailed as error:
            context.abort(grpc.StatusCode.UNAVAILABLE, str(error))
        finally:
            timer.cancel()
        with self._lock:
            self.streams_served += 1


def _parse_request(data: bytes) -> pb.RelayRequest:
    """The request; an empty one (refused: no wire version) for bytes that do not parse, since grpcio
    leaks memory on a raising deserializer (learner/service/tolerant_handlers.py) and takes None as one."""
    try:
        return pb.RelayRequest.FromString(data)
    except Exception:  # any parse failure is a refusal, never a raise
        return pb.RelayRequest()


def relay_chunks(peer: pb.PeerWeights, metadata: tuple[tuple[str, str], ...], reaper: IdleReaper,
                 timeout_s: float) -> Iterator[pb.WeightMessage]:
    """The chunks of `peer.version` from the relaying actor at `peer.address`: chunk messages only.
    Anything else, no message for `reaper`'s idle timeout (it cancels the call), more than `timeout_s`
    in all, or any failure raises RelayFailed."""
    channel = grpc.insecure_channel(peer.address, options=grpc_options())
    call = rpc.WeightRelayStub(channel).RelayWeights(
        pb.RelayRequest(wire_version=WIRE_VERSION, version=peer.version), metadata=metadata, timeout=timeout_s)
    try:
        with reaper.watch(f"weight relay from {peer.actor_id} at {peer.address}", call.cancel) as progress:
            for message in call:
                progress.touch()
                if message.WhichOneof("part") != "chunk":
                    raise RelayFailed(f"relay {peer.actor_id} sent a {message.WhichOneof('part') or 'empty'} message")
                yield message
    except grpc.RpcError as error:  # CANCELLED: only the reaper cancels it before this point
        why = "sent nothing (cancelled when idle)" if error.code() == grpc.StatusCode.CANCELLED else \
            f"{error.code().name}: {error.details()}"
        raise RelayFailed(f"relay {peer.actor_id} at {peer.address}: {why}") from None
    finally:
        call.cancel()
        channel.close()


def relay_host_towards(learner_address: str) -> str:
    """This host's address on the interface that reaches the learner: where other actors can likely
    reach it too (a UDP connect sends nothing)."""
    host, _, port = learner_address.rpartition(":")
    host = host.strip("[]")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.connect((host, int(port)))
            own = probe.getsockname()[0]
    except OSError:
        return "127.0.0.1"
    return f"[{own}]" if family == socket.AF_INET6 else own


class RelayHalf(ActorHalf):
    """Names this actor's relay server in every fetch (the learner may send others to it) and watches each
    version land into it; reads a PeerWeights answer from the relay it names."""

    def __init__(self, relay: WeightRelayServer, token_metadata: tuple[tuple[str, str], ...]) -> None:
        self._relay, self._metadata = relay, token_metadata

    def prepare(self, request: pb.FetchWeightsRequest, offered: bool) -> StagingWatcher | None:
        request.relay_address = self._relay.address
        return self._relay.staging()  # before the call: the learner may send others here at once

    def receive(self, answer: Iterator[pb.WeightMessage]) -> Iterator[pb.WeightMessage]:
        """The answer with its PeerWeights replaced by that relay's chunks (the learner's commit is read
        first, so its call ends before the relay's)."""
        for message in answer:
            if message.WhichOneof("part") == "peer":
                rest = list(answer)
                yield from relay_chunks(message.peer, self._metadata, self._relay.reaper, self._relay.stream_timeout_s)
                yield from rest
                return
            yield message


def actor_half(*, relay: WeightRelayServer | None = None, token_metadata: tuple[tuple[str, str], ...] = (),
               **_: object) -> RelayHalf | None:
    """The half, when this actor runs a relay server."""
    return RelayHalf(relay, token_metadata) if relay is not None else None

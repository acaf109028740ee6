"""Shared pieces of the wire tests: a tiny prompt dataset, valid scored groups, a running service, and
a raw actor that speaks the wire contract directly (as an independent client written from proto/)."""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import h2.config
import h2.connection
import h2.events
import numpy as np
import psutil
from config_helpers import service_config

from actors.learner_client import LearnerClient, Prompt
from learner.service import prompt_source
from learner.service.accounting import balance_violations
from learner.service.prompt_source import PromptSource
from learner.service.server import LearnerService
from tandem_wire import WIRE_VERSION, grpc_options, pb, rpc
from tandem_wire.limits import CREDENTIAL_METADATA_KEY, ENROLLMENT_METADATA_KEY

ROOT = Path(__file__).resolve().parents[1]
VOCAB = 64
CAPABILITIES = {
    "engine": "test",
    "model_family": "qwen2",
    "max_model_len": 128,
    "group_size": 4,
    "host": "localhost",
}


class FakeClock:
    """A clock that stands still until a test sets `now`."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def make_prompts(n: int, length: int = 5, seed: int = 0) -> list[prompt_source.Prompt]:
    """A learner's dataset of `n` random prompts of `length` tokens."""
    rng = np.random.default_rng(seed)
    return [
        prompt_source.Prompt(rng.integers(5, VOCAB, size=length).tolist(), f"prompt {i}", {"answer": str(i)})
        for i in range(n)
    ]


def make_group(
    lease: Prompt,
    actor_id: str,
    *,
    policy_version: int = 0,
    group_size: int = 4,
    tokens: int = 6,
    seed: int = 0,
) -> pb.ScoredGroup:
    """A valid ScoredGroup for a leased prompt (completion 0 is unscorable, the rest rewarded)."""
    rng = np.random.default_rng(seed)
    group = pb.ScoredGroup(
        wire_version=WIRE_VERSION,
        group_id=lease.group_id,
        actor_id=actor_id,
        policy_version=policy_version,
        prompt_token_ids=lease.prompt_ids,
        metadata=lease.metadata,
        timings=pb.Timings(sample_seconds=0.1, score_seconds=0.01, sampled_at=time.time()),
    )
    for i in range(group_size):
        completion = group.completions.add(
            token_ids=rng.integers(0, VOCAB, size=tokens).tolist(),
            logprobs=(-rng.random(tokens) * 3).astype(np.float32).tolist(),
            finish_reason=pb.FINISH_REASON_STOP,
            text=f"c{i}",
            token_versions=[policy_version] * tokens,
        )
        if i == 0:
            completion.unscorable_reason = "reward timed out"
        else:
            completion.reward = float(i % 2)
    return group


@contextlib.contextmanager
def running_service(
    prompts: PromptSource | None = None, address: str = "127.0.0.1:0", service: LearnerService | None = None,
    enrollment_key: bytes | None = None, **config
) -> Iterator[tuple[LearnerService, str]]:
    """Start ``service`` (default: a new one over ``prompts`` with ``config``, enrolling under
    ``enrollment_key``) and stop it afterwards."""
    config.setdefault("group_size", 4)
    config.setdefault("vocab_size", VOCAB)
    service = service or LearnerService(prompts or PromptSource(make_prompts(32)), service_config(**config),
                                        enrollment_key=enrollment_key)
    bound = service.start(address)
    try:
        yield service, bound
    finally:
        service.stop(grace=0)


def wait_until(predicate: Callable[[], bool], timeout: float = 10.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def connected_client(address: str, actor_id: str = "actor-0", **kwargs) -> LearnerClient:
    client = LearnerClient(address, actor_id, **kwargs)
    client.register(CAPABILITIES, weight_version=0)
    return client


def assert_honest_actor_served(service: LearnerService, address: str, actor_id: str = "honest",
                               **kwargs) -> None:
    """A legitimate actor's whole flow still works (register, lease, send, QUEUED, consumed, CONSUMED
    ack) and the books balance exactly. Groups queued before it are consumed along the way."""
    client = connected_client(address, actor_id, **kwargs)
    try:
        (lease,) = client.lease_prompts(1).prompts
        client.send_group(make_group(lease, actor_id, policy_version=service.latest_version))
        taken: list[str] = []
        while lease.group_id not in taken:
            batch = service.next_batch(1, timeout=10)
            assert batch, f"{actor_id}'s group never reached the trainer: {client.counts()}"
            service.mark_consumed([r.group_id for r in batch])
            taken += [r.group_id for r in batch]
        assert client.drain(10) and client.counts()["consumed"] == 1, client.counts()
    finally:
        client.close()
    counts = service.accounting()
    assert balance_violations(counts) == [], counts


SERVER_SCRIPT = """
import json, sys
sys.path[:0] = [{root!r}, {tests!r}]
from wire_helpers import make_prompts
from learner.service.prompt_source import PromptSource
from config_helpers import service_config
from learner.service.server import LearnerService
service = LearnerService(PromptSource(make_prompts(64), epochs=None), service_config(**json.loads(sys.argv[1])))
print(service.start("127.0.0.1:0"), flush=True)
sys.stdin.read()
"""


@contextlib.contextmanager
def server_process(**config) -> Iterator[tuple[str, psutil.Process]]:
    """A learner server over 64 prompts (cycled forever) in its own process, so that its memory can be
    measured: yields (address, process)."""
    script = SERVER_SCRIPT.format(root=str(ROOT), tests=str(ROOT / "tests"))
    server = subprocess.Popen([sys.executable, "-c", script, json.dumps(config)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        address = server.stdout.readline().strip()
        assert address, "server did not start"
        yield address, psutil.Process(server.pid)
        assert server.poll() is None, "server died"
    finally:
        server.kill()
        server.wait()


def wire_accounting(stub: rpc.LearnerStub) -> dict[str, int]:
    """The Status RPC's counters, every field present."""
    status = stub.Status(pb.StatusRequest(), timeout=10)
    counts = {f.name: 0 for f in pb.Accounting.DESCRIPTOR.fields}
    counts.update({f.name: v for f, v in status.accounting.ListFields()})
    return counts


class RawActor:
    """An actor that speaks the wire contract with a raw stub: it registers, holds the credential the
    learner returns and sends it (or, for hostile tests, anything else) with every call, next to its
    `enrollment` token when it has one."""

    def __init__(self, address: str, actor_id: str, auth_token: str | None = None,
                 enrollment: str | None = None) -> None:
        self.address = address
        self.actor_id = actor_id
        self.channel = grpc.insecure_channel(address, options=grpc_options())
        self.stub = rpc.LearnerStub(self.channel)
        self.token = ((("authorization", f"Bearer {auth_token}"),) if auth_token else ())
        self.enrollment = ((ENROLLMENT_METADATA_KEY, enrollment),) if enrollment else ()
        self.credential: str | None = None

    def metadata(self, credential: str | None = None) -> tuple[tuple[str, str], ...]:
        credential = credential or self.credential
        return self.token + self.enrollment + (((CREDENTIAL_METADATA_KEY, credential),) if credential else ())

    def register(self, capabilities: dict | None = None, weight_version: int = 0,
                 credential: str | None = None) -> pb.RegisterReply:
        reply = self.stub.Register(pb.RegisterRequest(
            wire_version=WIRE_VERSION, actor_id=self.actor_id,
            capabilities=pb.ActorCapabilities(**(capabilities or CAPABILITIES)), weight_version=weight_version,
        ), metadata=self.metadata(credential), timeout=10)
        self.credential = reply.credential
        return reply

    def lease(self, n: int) -> tuple[list[Prompt], bool]:
        reply = self.stub.LeasePrompts(
            pb.LeasePromptsRequest(wire_version=WIRE_VERSION, actor_id=self.actor_id, max_prompts=n),
            metadata=self.metadata(), timeout=10)
        return [Prompt(list(p.token_ids), p.text, dict(p.metadata), group_id=p.group_id) for p in reply.prompts], \
            reply.exhausted

    def exchange(self, groups: list[pb.ScoredGroup], credential: str | None = None) -> list[pb.GroupAck]:
        """Send groups on one StreamGroups call, half-close, return all acks."""
        return list(self.stub.StreamGroups(iter(groups), metadata=self.metadata(credential), timeout=30))

    def close(self) -> None:
        self.channel.close()


def raw_actor(address: str, actor_id: str = "actor-0", **register) -> RawActor:
    actor = RawActor(address, actor_id)
    actor.register(**register)
    return actor


def raw_http2_call(address: str, method: str, request: Any, headers: list[tuple[bytes, bytes]],
                   timeout: float = 10.0) -> dict[bytes, bytes]:
    """One gRPC call to the Learner service over hand-written HTTP/2 (hyper-h2), so header values can
    be bytes no grpc-python client will send (non-ASCII UTF-8, Latin-1). Sends `request` as the only
    message and half-closes; returns the response headers and trailers merged (grpc-status among them)."""
    host, port = address.rsplit(":", 1)
    conn = h2.connection.H2Connection(h2.config.H2Configuration(
        client_side=True, header_encoding=None, validate_outbound_headers=False,
        normalize_outbound_headers=False))
    received: dict[bytes, bytes] = {}
    with socket.create_connection((host, int(port)), timeout=timeout) as sock:
        conn.initiate_connection()
        stream_id = conn.get_next_available_stream_id()
        conn.send_headers(stream_id, [
            (b":method", b"POST"), (b":scheme", b"http"), (b":path", f"/tandem.v1.Learner/{method}".encode()),
            (b":authority", address.encode()), (b"content-type", b"application/grpc"), (b"te", b"trailers"),
            *headers,
        ])
        body = request.SerializeToString()
        conn.send_data(stream_id, b"\x00" + len(body).to_bytes(4, "big") + body, end_stream=True)
        sock.sendall(conn.data_to_send())
        ended = False
        while not ended:
            data = sock.recv(65536)
            if not data:
                break
            for event in conn.receive_data(data):
                if isinstance(event, (h2.events.ResponseReceived, h2.events.TrailersReceived)):
                    received.update(dict(event.headers))
                elif isinstance(event, h2.events.DataReceived):
                    conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
                if isinstance(event, (h2.events.StreamEnded, h2.events.StreamReset)) and event.stream_id == stream_id:
                    ended = True
            sock.sendall(conn.data_to_send())
        conn.close_connection()
        sock.sendall(conn.data_to_send())
    return received

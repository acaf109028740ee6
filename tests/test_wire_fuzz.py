"""Hostile input: over 10,000 random and mutated serialized messages, sent through raw gRPC
channels to a learner server in its own process. It must answer each with a status, keep
serving valid requests, keep its accounting balanced and keep its memory bounded."""

from __future__ import annotations

import time

import grpc
import numpy as np
from wire_helpers import CAPABILITIES, make_group, raw_actor, server_process, wire_accounting

from learner.service.accounting import balance_violations
from tandem_wire import WIRE_VERSION, grpc_options, pb

MAX_GROUP_BYTES = 4 * 1024 * 1024
METHOD = "/tandem.v1.Learner/"


def _flip_bits(data: bytes, rng: np.random.Generator) -> bytes:
    buf = bytearray(data)
    for _ in range(int(rng.integers(1, 9))):
        position = int(rng.integers(len(buf) * 8))
        buf[position // 8] ^= 1 << (position % 8)
    if rng.random() < 0.2:  # sometimes truncate as well
        buf = buf[: int(rng.integers(1, len(buf)))]
    return bytes(buf)


def _huge_groups(template: pb.ScoredGroup) -> list[bytes]:
    """Groups with enormous repeated fields that still fit under the server's message limit."""
    out = []
    for kind in ("tokens", "completions", "metadata", "prompt"):
        group = pb.ScoredGroup()
        group.CopyFrom(template)
        if kind == "tokens":
            group.completions[1].token_ids.extend([1] * 900_000)
        elif kind == "completions":
            for _ in range(150_000):
                group.completions.add(token_ids=[1], logprobs=[-0.5], reward=1.0)
        elif kind == "metadata":
            group.metadata.update({f"k{i}": "v" for i in range(200_000)})
        else:
            group.prompt_token_ids.extend(range(900_000))
        data = group.SerializeToString()
        assert len(data) < MAX_GROUP_BYTES, (kind, len(data))
        out.append(data)
    return out


class RawChannel:
    """Sends arbitrary bytes as requests of the Learner service's methods, with `metadata` (the
    fuzzing actor's credential) on every call."""

    def __init__(self, address: str, metadata: tuple[tuple[str, str], ...]) -> None:
        self.metadata = metadata
        self.channel = grpc.insecure_channel(address, options=grpc_options())
        identity = bytes
        self.stream_groups = self.channel.stream_stream(
            METHOD + "StreamGroups", request_serializer=identity, response_deserializer=pb.GroupAck.FromString
        )
        self.unary = {
            name: self.channel.unary_unary(
                METHOD + name, request_serializer=identity, response_deserializer=identity
            )
            for name in ("Register", "LeasePrompts")
        }

    def stream(self, messages: list[bytes]) -> tuple[list[pb.GroupAck], grpc.StatusCode]:
        call = self.stream_groups(iter(messages), metadata=self.metadata, timeout=60)
        acks = []
        try:
            acks.extend(call)
            return acks, grpc.StatusCode.OK
        except grpc.RpcError as error:
            return acks, error.code()

    def unary_many(self, name: str, messages: list[bytes]) -> list[grpc.StatusCode]:
        futures = [self.unary[name].future(m, metadata=self.metadata, timeout=60) for m in messages]
        codes = []
        for future in futures:
            try:
                future.result()
                codes.append(grpc.StatusCode.OK)
            except grpc.RpcError as error:
                codes.append(error.code())
        return codes


def test_fuzzed_messages_never_take_the_server_down_and_memory_stays_bounded():
    rng = np.random.default_rng(1234)
    # prompts_per_step=0: fuzzed LeasePrompts calls lease without a budget (no learner steps here)
    config = dict(group_size=4, vocab_size=64, queue_capacity=16, max_group_bytes=MAX_GROUP_BYTES,
                  prompts_per_step=0)
    with server_process(**config) as (address, process):
        client = raw_actor(address, "fuzzer")
        leases, _ = client.lease(8)
        valid = [make_group(lease, "fuzzer", seed=i).SerializeToString() for i, lease in enumerate(leases)]
        raw = RawChannel(address, client.metadata())
        start, sent, rss = time.monotonic(), 0, []
        acked = undecodable = 0
        for _ in range(2):  # two equal rounds: memory must not grow with the count
            # 1. Bit-flipped (sometimes truncated) valid groups and random bytes, 250 per stream;
            #    every message, decodable or not, is answered with an ack and the stream goes on.
            messages = [_flip_bits(valid[int(rng.integers(len(valid)))], rng) for _ in range(3000)]
            messages += [rng.bytes(int(rng.integers(0, 300))) for _ in range(800)]
            rng.shuffle(messages)
            for i in range(0, len(messages), 250):
                acks, code = raw.stream(messages[i : i + 250])
                assert code == grpc.StatusCode.OK and len(acks) == len(messages[i : i + 250])
                acked += len(acks)
                undecodable += sum(a.detail.startswith("undecodable") for a in acks)
            sent += len(messages)
            # 3. Unary methods: random bytes and mutated valid requests.
            register = pb.RegisterRequest(
                wire_version=WIRE_VERSION, actor_id="x", capabilities=pb.ActorCapabilities(**CAPABILITIES)
            ).SerializeToString()
            lease = pb.LeasePromptsRequest(
                wire_version=WIRE_VERSION, actor_id="fuzzer", max_prompts=2
            ).SerializeToString()
            for name, template in (("Register", register), ("LeasePrompts", lease)):
                messages = [rng.bytes(int(rng.integers(0, 100))) for _ in range(400)]
                messages += [_flip_bits(template, rng) for _ in range(400)]
                codes = raw.unary_many(name, messages)
                assert grpc.StatusCode.UNAVAILABLE not in codes
                sent += len(messages)
            # 4. Huge repeated fields within the size limit, and one over it.
            for message in _huge_groups(pb.ScoredGroup.FromString(valid[0])):
                acks, code = raw.stream([message])
                assert code == grpc.StatusCode.OK and len(acks) == 1
                acked += 1
            acks, code = raw.stream([b"\x0a" + b"\xff" * 5 + b"\x00" * MAX_GROUP_BYTES])
            assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
            sent += 5
            rss.append(process.memory_info().rss)
        elapsed = time.monotonic() - start
        assert sent >= 10_000 and undecodable > 1000
        print(
            f"\nfuzz: {sent} messages in {elapsed:.1f} s, {acked} group acks ({undecodable} undecodable), "
            f"server RSS MiB after each round {[r >> 20 for r in rss]}"
        )
        # Measured: +10-20 MiB per round for the first rounds (allocator arenas of the reader threads
        # filling up after the huge messages), levelling off near 190 MiB after 12 rounds.
        assert rss[1] - rss[0] < 64 << 20, f"server RSS grew from {rss[0] >> 20} to {rss[1] >> 20} MiB"
        assert rss[1] < 400 << 20, f"server RSS {rss[1] >> 20} MiB"

        # Still serving: a valid group from a fresh lease is queued, and the books balance.
        (fresh,), _ = client.lease(1)
        acks, code = raw.stream([make_group(fresh, "fuzzer").SerializeToString()])
        assert code == grpc.StatusCode.OK and acks[0].status in (pb.ACK_STATUS_QUEUED, pb.ACK_STATUS_RETRY)
        counts = wire_accounting(client.stub)
        assert counts["groups_received"] == acked + 1 and balance_violations(counts) == []
        client.close()
        raw.channel.close()

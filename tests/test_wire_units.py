"""The wire plane's pieces without a network: message round-trips, weight packing and staging,
prompt leasing and its checkpoint, the queue's credits, the accounting invariants."""

from __future__ import annotations

import itertools
import json
import re
import typing
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from google.protobuf import descriptor as _descriptor
from wire_helpers import FakeClock

from actors.weights.staging import WeightTransferError, stage_weights
from learner.schema import ServerConfig
from learner.service.accounting import GROUP_COUNTERS, TOKEN_COUNTERS, balance_violations
from learner.service.group_queue import GroupQueue, is_stale
from learner.service.group_validation import GroupRecord
from learner.service.prompt_source import MAX_EARLIER_HOLDERS, LeaseInfo, Prompt, PromptSource, PromptState
from learner.weights.publisher import ALIGNMENT, WeightPublisher, pack_weights
from tandem_wire import pb
from tandem_wire.weights.chunks import encode_chunk
from tandem_wire.weights.digest import (
    CRYPTOGRAPHIC,
    DEFAULT_DIGEST,
    DEFAULT_SHARED_DIGEST,
    DIGESTS,
    UnknownDigest,
    hexdigest,
)

FD = _descriptor.FieldDescriptor
MESSAGE_TYPES = sorted(pb.DESCRIPTOR.message_types_by_name)
PROTO = Path(__file__).resolve().parents[1] / "proto" / "tandem_wire" / "tandem.proto"


# ---------------------------------------------------------------- messages


def _value(field: _descriptor.FieldDescriptor, k: int):
    """A non-default value for a scalar field (k varies repeated elements)."""
    return {
        FD.TYPE_STRING: f"{field.name}-{k}-é",
        FD.TYPE_BYTES: bytes([k, 0, 255]) * 3,
        FD.TYPE_BOOL: True,
        FD.TYPE_DOUBLE: -1.5 - k,
        FD.TYPE_FLOAT: 0.25 + k,  # exactly representable in float32
        FD.TYPE_ENUM: field.enum_type.values[-1].number if field.enum_type else 0,
    }.get(field.type, -(2**31) + 7 + k if field.type in (FD.TYPE_INT32, FD.TYPE_SINT32) else 2**40 + k)


def _fill(msg, choices: dict[str, str]) -> None:
    """Set every field of `msg` (recursively); in each oneof only the field `choices` names
    (default: the first)."""
    for field in msg.DESCRIPTOR.fields:
        oneof = field.containing_oneof
        if oneof is not None and field.name != choices.get(oneof.name, oneof.fields[0].name):
            continue
        repeated = field.is_repeated
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            value_field = field.message_type.fields_by_name["value"]
            getattr(msg, field.name).update({"k1": _value(value_field, 1), "k2": _value(value_field, 2)})
        elif field.message_type is not None:
            if repeated:
                for _ in range(2):
                    _fill(getattr(msg, field.name).add(), {})
            else:
                _fill(getattr(msg, field.name), {})
        elif repeated:
            getattr(msg, field.name).extend([_value(field, 1), _value(field, 2)])
        else:
            setattr(msg, field.name, _value(field, 0))


def _variants(name: str):
    """One message per combination of oneof choices, every field set."""
    cls = getattr(pb, name)
    oneofs = [[(o.name, f.name) for f in o.fields] for o in cls.DESCRIPTOR.oneofs]
    for combination in itertools.product(*oneofs):
        msg = cls()
        _fill(msg, dict(combination))
        yield msg


@pytest.mark.parametrize("name", MESSAGE_TYPES)
def test_every_message_round_trips_with_all_fields_set(name):
    for msg in _variants(name):
        present = {f.name for f, _ in msg.ListFields()}
        expected = {
            f.name
            for f in msg.DESCRIPTOR.fields
            if f.containing_oneof is None or msg.WhichOneof(f.containing_oneof.name) == f.name
        }
        assert present == expected, f"{name}: fields left unset {expected - present}"
        data = msg.SerializeToString(deterministic=True)  # maps have no canonical order otherwise
        back = getattr(pb, name).FromString(data)
        assert back == msg and back.SerializeToString(deterministic=True) == data


def test_round_trip_covers_every_message_of_the_contract():
    declared = re.findall(r"^message (\w+)", PROTO.read_text(), flags=re.MULTILINE)
    assert sorted(declared) == MESSAGE_TYPES


# ---------------------------------------------------------------- weights


def _tensors(seed: int = 0) -> list[tuple[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [
        ("model.embed_tokens.weight", rng.standard_normal((37, 16)).astype(np.float32)),
        ("model.norm.weight", rng.standard_normal(16).astype(ml_dtypes.bfloat16)),
        ("lm_head.weight", rng.standard_normal((16, 37)).astype(np.float16)),
        ("scalar", np.array(3.5, dtype=np.float32)),
        ("empty", np.zeros((0, 4), dtype=np.float32)),
    ]


def _assert_bit_equal(expected, got):
    assert [n for n, _ in expected] == [n for n, _ in got]
    for (name, a), (_, b) in zip(expected, got, strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape, name
        assert a.tobytes() == b.tobytes(), name


def test_pack_and_stage_are_bit_exact_and_aligned():
    tensors = _tensors()
    blob = pack_weights(3, tensors, chunk_bytes=100)
    assert all(spec.offset % ALIGNMENT == 0 for spec in blob.header.tensors)
    messages = [pb.WeightMessage.FromString(m) for m in blob.messages]
    assert sum(m.WhichOneof("part") == "chunk" for m in messages) > 3
    staged = stage_weights(messages, version=3)
    assert staged.version == 3 and staged.checksum == blob.checksum
    _assert_bit_equal(tensors, staged.tensors)


@pytest.mark.parametrize(
    "version, offset, size",
    [(1, 64, 100), (2**40, 2**35 + 3, 300), (127, 128, 16383), (7, 1, 16384), (0, 0, 5), (3, 0, 0)],
)
def test_hand_encoded_chunks_are_what_protobuf_encodes(version, offset, size):
    data = bytes(range(256)) * (size // 256) + bytes(size % 256)
    expected = pb.WeightMessage(chunk=pb.WeightChunk(version=version, offset=offset, data=data))
    encoded = encode_chunk(version, offset, memoryview(data))
    assert pb.WeightMessage.FromString(encoded) == expected
    if version and offset and size:  # protobuf omits zero-valued fields; otherwise byte-identical
        assert encoded == expected.SerializeToString()


def test_pack_rejects_bad_tensors():
    with pytest.raises(ValueError, match="dtype"):
        pack_weights(1, [("x", np.zeros(3, dtype=np.int64))])
    with pytest.raises(ValueError, match="unique"):
        pack_weights(1, [("x", np.zeros(3, np.float32)), ("x", np.zeros(3, np.float32))])


def _stream(chunk_bytes: int = 64) -> list[pb.WeightMessage]:
    return [pb.WeightMessage.FromString(m) for m in pack_weights(5, _tensors(), chunk_bytes).messages]


def _tampered(mutate) -> list[pb.WeightMessage]:
    messages = _stream()
    mutate(messages)
    return messages


@pytest.mark.parametrize(
    "mutate, error",
    [
        (
            lambda m: m.__setitem__(
                2,
                pb.WeightMessage(
                    chunk=pb.WeightChunk(
                        version=5,
                        offset=m[2].chunk.offset,
                        data=bytes([m[2].chunk.data[0] ^ 1]) + m[2].chunk.data[1:],
                    )
                ),
            ),
            "blake3 mismatch",
        ),
        (lambda m: m.pop(-1), "truncated"),
        (lambda m: m.pop(3), "offset"),
        (lambda m: m.pop(0), "header"),
        (lambda m: m.insert(4, m[3]), "offset"),
        (lambda m: m.append(m[-1]), "after the commit"),
        (lambda m: m[-1].commit.__setattr__("total_bytes", 1), "received"),
        (lambda m: m[2].chunk.__setattr__("version", 4), "version 4"),
        (lambda m: m[0].header.tensors[0].__setattr__("nbytes", 4), "does not match"),
        (lambda m: m[0].header.tensors[1].__setattr__("offset", 10**9), "bad offset"),
        (lambda m: m[0].header.tensors[1].__setattr__("dtype", 99), "unknown dtype"),
        (lambda m: m[0].header.__setattr__("total_bytes", 2**50), "implausible"),
        (lambda m: m[0].header.__setattr__("checksum_algorithm", "md5"), "'md5' is not one of"),
        (lambda m: m[0].header.__setattr__("checksum_algorithm", "xxh3_128"), "may come from another actor"),
        (lambda m: m[0].header.__setattr__("checksum_algorithm", "sha256"), "sha256 mismatch"),
        (lambda m: m.insert(3, pb.WeightMessage(header=m[0].header)), "unexpected header"),
    ],
)
def test_staging_rejects_every_broken_stream(mutate, error):
    with pytest.raises(WeightTransferError, match=error):
        stage_weights(_tampered(mutate))


@pytest.mark.parametrize("kind", sorted(CRYPTOGRAPHIC))
def test_the_digest_the_learner_chose_is_on_the_wire_and_verified_with(kind):
    blob = pack_weights(5, _tensors(), chunk_bytes=64, digest=kind)
    messages = [pb.WeightMessage.FromString(m) for m in blob.messages]
    assert messages[0].header.checksum_algorithm == kind
    assert blob.checksum == hexdigest(kind, b"".join(m.chunk.data for m in messages[1:-1]))
    assert stage_weights(messages).checksum == blob.checksum
    with pytest.raises(UnknownDigest):
        pack_weights(5, _tensors(), digest="crc32")


def test_the_config_offers_exactly_the_digests_both_ends_implement():
    """Streams (which a relay may carry) only cryptographic kinds; shared files any kind."""
    assert set(typing.get_args(ServerConfig.model_fields["weight_digest"].annotation)) == CRYPTOGRAPHIC
    assert set(typing.get_args(ServerConfig.model_fields["shared_weight_digest"].annotation)) == set(DIGESTS)
    assert ServerConfig().weight_digest == DEFAULT_DIGEST
    assert ServerConfig().shared_weight_digest == DEFAULT_SHARED_DIGEST not in CRYPTOGRAPHIC


def test_staging_rejects_a_version_other_than_the_one_asked_for():
    with pytest.raises(WeightTransferError, match="asked for version 6"):
        stage_weights(_stream(), version=6)


def test_publisher_keeps_the_newest_version_and_older_ones_only_while_read():
    publisher = WeightPublisher()
    with pytest.raises(KeyError):
        publisher.acquire()
    publisher.publish(pack_weights(1, _tensors(1)))
    reading = publisher.acquire(1)
    publisher.publish(pack_weights(2, _tensors(2)))
    assert publisher.acquire(1) is reading  # still held: a stream is reading it
    publisher.release(reading)
    publisher.release(reading)
    with pytest.raises(KeyError):
        publisher.acquire(1)
    assert publisher.acquire().version == 2
    with pytest.raises(ValueError, match="not newer"):
        publisher.publish(pack_weights(2, _tensors(3)))


# ---------------------------------------------------------------- prompts


def _rows(n: int) -> list[Prompt]:
    return [Prompt([i + 1, 2], f"t{i}", {"i": str(i)}) for i in range(n)]


def test_prompts_are_issued_in_a_seeded_shuffle_per_epoch_then_exhausted():
    source = PromptSource(_rows(5), epochs=2, seed=7)
    first = [p.group_id for p in source.lease("a", 5, 10)]
    second = [p.group_id for p in source.lease("a", 10, 10)]
    assert sorted(first) == [f"0:{i}" for i in range(5)] and sorted(second) == [f"1:{i}" for i in range(5)]
    assert first != [f"0:{i}" for i in range(5)] or second != [f"1:{i}" for i in range(5)]
    assert [p.group_id for p in PromptSource(_rows(5), epochs=2, seed=7).lease("b", 5, 10)] == first
    assert source.lease("a", 3, 10) == [] and not source.exhausted()
    for key in first + second:
        source.retire(key)
    assert source.exhausted()
    leased = source.lease  # a retired prompt is never leased again
    assert leased("a", 10, 10) == []
    row = PromptSource(_rows(5), epochs=1).lease("a", 1, 1)[0]
    assert row.metadata == {"i": row.group_id.split(":")[1]} and row.prompt_ids[1] == 2


def test_expired_and_released_leases_are_reissued_and_retired_prompts_never():
    clock = FakeClock()
    source = PromptSource(_rows(4), epochs=1, clock=clock)
    a = source.lease("a", 2, lease_seconds=10)
    b = source.lease("b", 2, lease_seconds=10)
    assert source.lease("c", 4, 10) == []  # nothing expired yet
    source.hold(a[0].group_id)  # queued: its lease stops expiring
    source.retire(b[0].group_id)
    clock.now = 11
    reissued = {p.group_id for p in source.lease("c", 4, 10)}
    assert reissued == {a[1].group_id, b[1].group_id}
    source.release(b[1].group_id, holder="b")  # an old holder's late copy changes nothing
    assert source.lease("d", 4, 10) == []
    source.release(b[1].group_id, holder="c")
    assert [p.group_id for p in source.lease("d", 4, 10)] == [b[1].group_id]
    counts = source.counts()
    assert counts == {
        "prompts_leased": 7,
        "prompts_reissued": 3,
        "prompts_retired": 1,
        "prompts_outstanding": 3,
        "lease_slots_in_use": 4,  # the 3 outstanding and the retired (trained) one
    }
    assert counts["prompts_leased"] - counts["prompts_reissued"] == 1 + 3


def test_a_lease_names_its_holder_and_the_earlier_ones_and_a_restored_lease_nobody():
    clock = FakeClock()
    source = PromptSource(_rows(2), epochs=1, clock=clock)
    (prompt,) = source.lease("a#1", 1, lease_seconds=1)
    assert source.lease_info(prompt.group_id) == LeaseInfo("a#1", ())
    for now, holder in enumerate(["b#2", "a#1", "c#3"] + [f"x#{i}" for i in range(MAX_EARLIER_HOLDERS)], 2):
        clock.now = now
        assert [p.group_id for p in source.lease(holder, 1, lease_seconds=1)] == [prompt.group_id]
    info = source.lease_info(prompt.group_id)
    assert info.holder == f"x#{MAX_EARLIER_HOLDERS - 1}" and len(info.earlier) == MAX_EARLIER_HOLDERS
    assert info.earlier[:2] == ("c#3", "x#0")  # each holder once, the oldest dropped first
    restored = PromptSource(_rows(2), epochs=1, clock=clock)
    restored.load_state_dict(source.state_dict(), lease_seconds=1)
    assert restored.lease_info(prompt.group_id) == LeaseInfo("", ())
    source.retire(prompt.group_id)
    assert source.lease_info(prompt.group_id) is None


def test_prompt_state_and_unknown_keys():
    source = PromptSource(_rows(3), epochs=None)
    (p,) = source.lease("a", 1, 10)
    assert source.state(p.group_id) is PromptState.OUTSTANDING
    source.hold(p.group_id)
    assert source.state(p.group_id) is PromptState.HELD
    source.retire(p.group_id)
    assert source.state(p.group_id) is PromptState.RETIRED
    for key in ["", "0", "x:1", "0:3", "2:0", "00:1", "-1:0", "0:1\n", "٣:1", "0:" + "9" * 40]:
        assert source.state(key) is PromptState.UNKNOWN, key
    not_yet = [k for k in ("0:0", "0:1", "0:2") if k != p.group_id] + ["1:0"]
    assert all(source.state(key) is PromptState.UNISSUED for key in not_yet)
    with pytest.raises(KeyError):
        source.retire(p.group_id)


def test_prompt_state_survives_a_json_checkpoint_and_nothing_is_lost_or_repeated():
    clock = FakeClock()
    source = PromptSource(_rows(6), epochs=2, seed=3, clock=clock)
    issued = [p.group_id for p in source.lease("a", 8, 10)]
    for key in issued[:5]:
        source.retire(key)
    state = json.loads(json.dumps(source.state_dict()))
    restored = PromptSource(_rows(6), epochs=2, seed=3, clock=clock)
    restored.load_state_dict(state, lease_seconds=5)
    assert restored.counts() == source.counts()
    assert all(restored.state(k) is PromptState.RETIRED for k in issued[:5])
    assert all(restored.state(k) is PromptState.OUTSTANDING for k in issued[5:])
    fresh = [p.group_id for p in restored.lease("b", 20, 10)]
    assert fresh == [p.group_id for p in source.lease("b", 20, 10)]  # continues the same order
    clock.now = 6
    assert sorted(p.group_id for p in restored.lease("c", 20, 10)) == sorted(issued[5:])
    assert sorted(issued + fresh) == sorted(f"{e}:{i}" for e in range(2) for i in range(6))
    with pytest.raises(ValueError, match="does not match"):
        PromptSource(_rows(7), epochs=2, seed=3).load_state_dict(state, lease_seconds=1)


def test_fully_retired_epochs_are_compacted():
    source = PromptSource(_rows(3), epochs=None)
    for _ in range(3):
        for p in source.lease("a", 3, 10):
            source.retire(p.group_id)
    state = source.state_dict()
    assert state["complete_epochs"] == 3 and state["retired"] == {}


# ---------------------------------------------------------------- queue and accounting


def _record(group_id: str, actor: str, version: int = 0) -> GroupRecord:
    return GroupRecord(group_id, actor, version, [1], [], {})


def test_queue_is_bounded_and_credits_share_capacity_between_live_actors():
    q = GroupQueue(4)
    assert q.credits("a", live_actors=2) == 2
    q.put(_record("g1", "a"))
    q.put(_record("g2", "a"))
    assert q.credits("a", 2) == 0 and q.credits("b", 2) == 2
    q.put(_record("g3", "b"))
    q.put(_record("g4", "b"))
    assert q.full() and q.credits("c", 1) == 0
    with pytest.raises(OverflowError):
        q.put(_record("g5", "c"))
    assert q.pop().group_id == "g1" and "g1" in q and q.in_batch == 1 and q.depth == 3
    assert q.finish("g1").actor_id == "a" and "g1" not in q


def test_batches_take_the_oldest_policy_version_first_and_arrival_order_among_equals():
    """A group sampled a version behind its peers' is trained before theirs, not left to age past the
    staleness bound in the queue."""
    q = GroupQueue(8)
    for group_id, version in (("new-a", 8), ("old-a", 7), ("new-b", 8), ("old-b", 7), ("newest", 9)):
        q.put(_record(group_id, "a", version))
    assert [q.pop().group_id for _ in range(5)] == ["old-a", "old-b", "new-a", "new-b", "newest"]
    assert q.pop() is None and q.depth == 0 and q.in_batch == 5


def test_staleness_bound():
    assert not is_stale(3, 4, max_staleness=1) and is_stale(2, 4, max_staleness=1)
    assert not is_stale(4, 4, max_staleness=0) and is_stale(3, 4, max_staleness=0)


def test_balance_violations_names_the_broken_invariant():
    counts = dict.fromkeys(GROUP_COUNTERS + TOKEN_COUNTERS, 0) | {
        "groups_in_queue": 0,
        "groups_in_batch": 0,
        "tokens_in_queue": 0,
        "tokens_in_batch": 0,
        "groups_stale": 0,
        "prompts_leased": 0,
        "prompts_reissued": 0,
        "prompts_retired": 0,
        "prompts_outstanding": 0,
    }
    assert balance_violations(counts) == []
    counts["groups_received"] = 1
    assert [v.split(":")[0] for v in balance_violations(counts)] == [
        "received = queued + duplicate + stale_on_arrival + invalid + retry + too_long"
    ]
    counts["groups_received"] = 0
    counts["tokens_trained"] = 12  # trained tokens that were never queued
    assert [v.rsplit(":", 1)[0] for v in balance_violations(counts)] == [
        "tokens: queued = trained + no_signal + in_queue + in_batch + stale_at_dequeue + forgotten"
    ]

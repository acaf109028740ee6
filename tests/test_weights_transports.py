"""The weight path's one transport table (tandem_wire/weights/transports.py), read by both halves: the
learner answers a fetch with the first transport that serves it (real shared files in /dev/shm, a real
relay tree), an actor tries the bulk transports it can use and then the learner's stream; and a version's
kind travels in its header and decides how an actor applies it."""

from __future__ import annotations

import numpy as np
import pytest

from actors.weights.apply import APPLIERS, applier
from actors.weights.checks import WeightSetError
from actors.weights.staging import stage_weights
from actors.weights.transports import fetch_plan
from learner.weights.publisher import pack_weights
from learner.weights.relay import RelayTree
from learner.weights.shared_memory import SharedWeightFiles
from learner.weights.transports import Fetch, WeightTransports
from tandem_wire import pb
from tandem_wire.weights.manifest import FULL
from tandem_wire.weights.transports import RELAY, SHARED_MEMORY, STREAM, TRANSPORTS

TENSORS = [("model.norm.weight", np.arange(8, dtype=np.float32))]


def _part(message: bytes) -> str:
    return pb.WeightMessage.FromString(message).WhichOneof("part")


def test_the_learner_answers_with_the_first_transport_that_serves_the_fetch():
    files = SharedWeightFiles()
    try:
        weights = pack_weights(1, TENSORS, share=files.write)
        transports = WeightTransports(files, RelayTree(fanout=1))
        same_host = Fetch("a", files.domain, "a:1", accept_peer=True)
        assert transports.answer(weights, same_host) == (SHARED_MEMORY, weights.shared_messages)
        first = transports.answer(weights, Fetch("b", "elsewhere", "b:1", accept_peer=True))
        assert first == (STREAM, weights.messages)  # nobody relays yet: b is the first, and now relays
        transport, messages = transports.answer(weights, Fetch("c", "", "c:1", accept_peer=True))
        assert transport is RELAY and [_part(m) for m in messages] == ["header", RELAY.part, "commit"]
        assert pb.WeightMessage.FromString(messages[1]).peer.actor_id == "b"
        # an actor that accepts no peer reads the stream, whoever relays
        assert transports.answer(weights, Fetch("d", "", "", accept_peer=False))[0] is STREAM
        assert WeightTransports(None, None).answer(weights, same_host)[0] is STREAM
    finally:
        files.close()


def test_an_actor_offers_the_bulk_transports_it_can_use_then_the_learners_stream():
    assert [t.source for t in TRANSPORTS] == ["shared", "relayed", "streamed"]
    assert fetch_plan(shared_memory=True, relay=True) == ((SHARED_MEMORY, RELAY), ())
    assert fetch_plan(shared_memory=False, relay=True) == ((RELAY,), ())
    assert fetch_plan(shared_memory=True, relay=False) == ((SHARED_MEMORY,), ())
    assert fetch_plan(shared_memory=False, relay=False) == ((),)
    assert [t.bulk for t in TRANSPORTS] == [True, True, False]


def test_a_versions_kind_travels_in_its_header_and_decides_how_it_is_applied():
    weights = pack_weights(1, TENSORS)
    assert weights.header.kind == FULL == pb.WEIGHT_KIND_FULL
    staged = stage_weights(pb.WeightMessage.FromString(m) for m in weights.messages)
    assert staged.kind == FULL and applier(staged.kind) is APPLIERS[FULL]
    with pytest.raises(WeightSetError, match="weight kind 0 is not one this actor applies"):
        applier(pb.WEIGHT_KIND_UNSPECIFIED)

"""The weight path's one transport table (tandem_wire/weights/transports.py), read by both halves: the
learner's desk answers a fetch with the first transport that serves it (real shared files in /dev/shm, a
real relay tree), an actor offers the bulk transports it can use and then the learner's stream; a toy
transport registered from a test module (tests/toy_transport.py) moves versions over real gRPC without a
line of the service or the client changed; and a version's kind travels in its header and decides how an
actor applies it."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import toy_transport as toy
from wire_helpers import connected_client, running_service, service_config

from actors.weights.apply import APPLIERS, applier
from actors.weights.checks import WeightSetError
from actors.weights.fetcher import fetch_plan
from actors.weights.staging import stage_weights
from learner.weights.desk import WeightDesk
from tandem_wire import pb
from tandem_wire.weights.manifest import FULL
from tandem_wire.weights.shared_memory import shared_memory_domain
from tandem_wire.weights.transports import RELAY, SHARED_MEMORY, STREAM, TRANSPORTS, register, unregister

TENSORS = [("model.norm.weight", np.arange(8, dtype=np.float32))]
ROOT = Path(__file__).resolve().parents[1]


def _part(message: bytes) -> str:
    return pb.WeightMessage.FromString(message).WhichOneof("part")


def _request(actor_id: str, domain: str = "", relay_address: str = "") -> pb.FetchWeightsRequest:
    return pb.FetchWeightsRequest(actor_id=actor_id, shared_memory_domain=domain, relay_address=relay_address)


def test_the_learner_answers_with_the_first_transport_that_serves_the_fetch():
    counts: dict[str, int] = {}
    desk = WeightDesk(service_config(weight_relay_fanout=1), lambda name, n: counts.update({name: n}))
    try:
        weights = desk.pack(1, TENSORS)
        desk.publish(weights)
        domain = shared_memory_domain()

        def answer(actor_id, offers, domain="", relay=""):
            with desk.answer(0, desk.fetch(actor_id, _request(actor_id, domain, relay), offers)) as answered:
                return answered

        assert answer("a", "shared,relayed", domain, "a:1") == (SHARED_MEMORY, weights.extra["shared"])
        assert answer("a2", "relayed", domain, "") == (STREAM, weights.messages)  # shared memory not offered
        first = answer("b", "shared,relayed", "elsewhere", "b:1")
        assert first == (STREAM, weights.messages)  # nobody relays yet: b is the first, and now relays
        transport, messages = answer("c", "relayed", "", "c:1")
        assert transport is RELAY and [_part(m) for m in messages] == ["header", "peer", "commit"]
        assert pb.WeightMessage.FromString(messages[1]).peer.actor_id == "b" and counts == {
            "weight_bytes_shared": weights.header.total_bytes, "weight_fetches_relayed": 1}
        # an actor that offers no relay reads the stream, whoever relays; unknown offers are ignored
        assert answer("d", "pigeon,", "", "")[0] is STREAM
    finally:
        desk.close()
    bare = WeightDesk(service_config(weight_shared_memory=False, weight_relay_fanout=0), lambda name, n: None)
    bare.publish(bare.pack(1, TENSORS))
    with bare.answer(1, bare.fetch("a", _request("a"), "shared,relayed")) as (transport, _):
        assert transport is STREAM


def test_an_actor_offers_the_bulk_transports_it_can_use_then_the_learners_stream():
    assert [t.source for t in TRANSPORTS] == ["shared", "relayed", "streamed"]
    assert fetch_plan([SHARED_MEMORY, RELAY, STREAM]) == ((SHARED_MEMORY, RELAY), ())
    assert fetch_plan([STREAM, RELAY]) == ((RELAY,), ())
    assert fetch_plan([SHARED_MEMORY, STREAM]) == ((SHARED_MEMORY,), ())
    assert fetch_plan([STREAM]) == ((),)
    assert [t.bulk for t in TRANSPORTS] == [True, True, False]


@pytest.fixture
def courier(monkeypatch, tmp_path):
    """The toy transport registered (both halves from tests/toy_transport.py), leaving its files in tmp_path."""
    monkeypatch.setattr(toy, "DIRECTORY", tmp_path)
    register(toy.COURIER)
    try:
        yield toy.COURIER
    finally:
        unregister(toy.COURIER)


def test_a_toy_transport_registered_from_a_test_module_moves_versions_over_real_grpc(courier, tmp_path):
    """The walk-through of tandem_wire/weights/README.md: a row and two halves; neither the service nor the
    client names it, and when it fails the learner's stream stands in, as for the built-in ones."""
    assert TRANSPORTS.index(courier) == len(TRANSPORTS) - 2  # preferred over the stream only
    for hub in ("learner/service/server.py", "actors/learner_client.py"):
        assert "courier" not in (ROOT / hub).read_text()
    with running_service(weight_shared_memory=False, weight_relay_fanout=0) as (service, address):
        client = connected_client(address, shared_memory=False)
        try:
            for version in (1, 2):
                service.publish_weights(version, [(name, t + version) for name, t in TENSORS])
                staged = client.fetch_weights()
                assert staged.version == version
                assert np.array_equal(staged.tensors[0][1], TENSORS[0][1] + version)
            assert sorted(p.name for p in tmp_path.iterdir()) == [f"tandem-courier-{os.getpid()}-v{v}" for v in (1, 2)]
            assert client.weight_fetches["couriered"] == 2 and client.weight_fetches["streamed"] == 0
            # the courier loses the next version: its failure is counted and the stream brings it
            service.publish_weights(3, [(name, t + 3) for name, t in TENSORS])
            real_receive = toy.CourierIn.receive

            def losing(self, answer):
                for message in answer:
                    if message.WhichOneof("part") == "shared":
                        Path(message.shared.path).unlink()
                    yield from real_receive(self, iter([message]))

            toy.CourierIn.receive = losing
            try:
                assert client.fetch_weights().version == 3
            finally:
                toy.CourierIn.receive = real_receive
            assert {k: client.weight_fetches[k] for k in ("couriered", "courier_failed", "streamed")} == {
                "couriered": 2, "courier_failed": 1, "streamed": 1}
        finally:
            client.close()
    assert not list(tmp_path.iterdir())  # the learner half's close() took its files


def test_a_versions_kind_travels_in_its_header_and_decides_how_it_is_applied():
    weights = WeightDesk(service_config(weight_shared_memory=False), print).pack(1, TENSORS)
    assert weights.header.kind == FULL == pb.WEIGHT_KIND_FULL
    staged = stage_weights(pb.WeightMessage.FromString(m) for m in weights.messages)
    assert staged.kind == FULL and applier(staged.kind) is APPLIERS[FULL]
    with pytest.raises(WeightSetError, match="weight kind 0 is not one this actor applies"):
        applier(pb.WEIGHT_KIND_UNSPECIFIED)

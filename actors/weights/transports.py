"""The actor's half of the transport table (tandem_wire/weights/transports.py): what a fetch offers the
learner, in which order, and how the learner's answer is received.

A fetch first offers, in one FetchWeights call, every bulk transport this actor can use (its host's
shared memory, its relay); the learner answers with one of them or with its own chunks. When that call
fails, the fetch asks once more offering nothing: the learner's stream. The blob then arrives by the
transport the answer names: a SharedWeights file is mapped by staging (actors/weights/shared_memory.py),
a PeerWeights is replaced by the chunks that actor relays (actors/weights/relay.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from tandem_wire import pb
from tandem_wire.weights.transports import RELAY, SHARED_MEMORY, TRANSPORTS, Transport


def fetch_plan(shared_memory: bool, relay: bool) -> tuple[tuple[Transport, ...], ...]:
    """The FetchWeights calls a fetch tries in turn, each as the transports it offers: the bulk ones this
    actor can use, in the table's order, then none (the learner's stream). The last call's failure is
    the fetch's."""
    usable = {SHARED_MEMORY: shared_memory, RELAY: relay}
    bulk = tuple(transport for transport in TRANSPORTS if transport.bulk and usable[transport])
    return ((bulk,) if bulk else ()) + ((),)


def received(messages: Iterator[pb.WeightMessage], used: list[Transport],
             read_relay: Callable[[pb.PeerWeights], Iterator[pb.WeightMessage]]) -> Iterator[pb.WeightMessage]:
    """The learner's answer, with the bulk transport it chose noted in `used` (nothing: its own chunks) and
    a PeerWeights replaced by `read_relay`'s chunks (the learner's commit is read first, so its call ends
    before the relay's)."""
    for message in messages:
        part = message.WhichOneof("part")
        if part == SHARED_MEMORY.part:
            used.append(SHARED_MEMORY)
        elif part == RELAY.part:
            used.append(RELAY)
            rest = list(messages)
            yield from read_relay(message.peer)
            yield from rest
            return
        yield message

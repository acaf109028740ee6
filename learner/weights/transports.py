"""The learner's half of the transport table (tandem_wire/weights/transports.py): which transport answers
a FetchWeights, and the serialised stream it answers with. The service asks, and streams the answer.

Each row serves a fetch or passes (None), in the table's order: shared memory when the actor shares
this host's memory and the version has a file; else the relay, when another actor already fetches the
newest version (asking the relay tree also enrols this actor as a relay when it offers an address); else
the learner's own chunks, which serve every fetch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from learner.weights.publisher import WeightBlob
from learner.weights.relay import RelayTree
from learner.weights.shared_memory import SharedWeightFiles
from tandem_wire import pb
from tandem_wire.weights.transports import RELAY, SHARED_MEMORY, STREAM, TRANSPORTS, Transport

Messages = tuple[bytes, ...]


@dataclass(frozen=True)
class Fetch:
    """What one FetchWeights asks for (its fields checked against their bounds)."""

    actor_id: str
    shared_memory_domain: str  # "" unless the actor offers the shared-memory transport
    relay_address: str  # "" unless the actor relays what it fetches
    accept_peer: bool  # the actor offers the relay transport


class WeightTransports:
    """Answers fetches from this learner's shared files (None: no shared memory) and relay tree (None:
    actors do not relay)."""

    def __init__(self, shared: SharedWeightFiles | None, relays: RelayTree | None) -> None:
        self._shared = shared
        self._relays = relays
        self._rows: dict[Transport, Callable[[WeightBlob, Fetch], Messages | None]] = {
            SHARED_MEMORY: self._shared_memory, RELAY: self._relay, STREAM: lambda weights, fetch: weights.messages}

    def answer(self, weights: WeightBlob, fetch: Fetch) -> tuple[Transport, Messages]:
        """The first transport that serves `fetch` of `weights`, and its stream (header, blob, commit)."""
        return next((transport, messages) for transport in TRANSPORTS
                    if (messages := self._rows[transport](weights, fetch)) is not None)

    def _shared_memory(self, weights: WeightBlob, fetch: Fetch) -> Messages | None:
        if self._shared is not None and fetch.shared_memory_domain == self._shared.domain:
            return weights.shared_messages  # None: this version has no file (e.g. /dev/shm was full)
        return None

    def _relay(self, weights: WeightBlob, fetch: Fetch) -> Messages | None:
        if self._relays is None:
            return None
        peer = self._relays.source(weights.version, fetch.actor_id, fetch.relay_address, fetch.accept_peer)
        if peer is None:
            return None
        location = pb.PeerWeights(version=weights.version, address=peer.address, actor_id=peer.actor_id)
        return weights.messages[0], pb.WeightMessage(peer=location).SerializeToString(), weights.messages[-1]

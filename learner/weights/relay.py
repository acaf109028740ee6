"""The relay transport's learner half (tandem_wire/weights/transports.py): which actor relays a weight
version to which, so the learner's egress stays one version per publish for actors off its host, however
many fetch it (the relay tree).

The first actor that fetches the newest version over the stream gets the learner's chunks; every
later one is answered PeerWeights, naming an actor already fetching that version, whose relay server
(actors/weights/relay.py) forwards the chunks as they land: pipelined, so a chain never waits for a
whole copy. Each relay serves at most `fanout` actors, filled breadth first (in order of arrival),
so N actors sit log_fanout(N) deep. The header and commit always come from the learner, so a relay
can make a fetch fail but never change what is applied; the actor then asks the learner again offering
no relay, gets the chunks, and the relay it was sent to is sent nobody else for that version.

Only the newest version has a tree (actors fetch the newest); a fetch of an older one is served by the
learner. An actor that fetches the same version again is served by the learner too: it may relay to
others already, and being sent to one of them would be a cycle.
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING

from learner.weights.halves import Count, Fetch, LearnerHalf, Messages
from learner.weights.publisher import WeightBlob
from learner.wire_bounds import InvalidInput, check_text
from tandem_wire import pb
from tandem_wire.limits import MAX_LABEL_CHARS
from tandem_wire.weights.transports import RELAY

if TYPE_CHECKING:
    from learner.schema import ServiceConfig

RELAY_HOST = re.compile(r"[A-Za-z0-9._-]+|\[[0-9A-Fa-f:.]+\]")  # a name, IPv4, or [IPv6]


@dataclass
class Relay:
    actor_id: str
    address: str
    children: int = 0


class RelayTree:
    """Assigns each fetch of the newest version a source: the learner (None) or a relaying actor."""

    def __init__(self, fanout: int) -> None:
        if fanout < 1:
            raise ValueError(f"fanout must be >= 1, got {fanout}")
        self.fanout = fanout
        self._lock = threading.Lock()
        self._version = -1
        self._relays: dict[str, Relay] = {}  # actor_id -> relay, in order of arrival
        self._sent_to: dict[str, str] = {}  # actor_id -> the relay it was sent to

    def source(self, version: int, actor_id: str, relay_address: str, accept_peer: bool) -> Relay | None:
        """Where `actor_id` reads `version`'s blob from (None: the learner's chunks). An actor with a
        `relay_address` relays this version from now on; `accept_peer` False after being sent to a
        relay means that relay failed it."""
        with self._lock:
            if version < self._version:
                return None
            if version > self._version:
                self._version, self._relays, self._sent_to = version, {}, {}
            failed = None if accept_peer else self._sent_to.pop(actor_id, None)
            if failed is not None:
                self._relays.pop(failed, None)
            repeat = actor_id in self._relays or actor_id in self._sent_to
            peer = None
            if accept_peer and not repeat:
                peer = next((r for r in self._relays.values() if r.children < self.fanout), None)
            if peer is not None:
                peer.children += 1
                self._sent_to[actor_id] = peer.actor_id
            if relay_address and actor_id not in self._relays:
                self._relays[actor_id] = Relay(actor_id, relay_address)
            return peer


def relay_address(value: str) -> str:
    """An actor's relay server, "host:port" (empty: it relays nothing); other actors are sent there."""
    check_text("relay_address", value, MAX_LABEL_CHARS, printable=True)
    host, _, port = value.rpartition(":")
    if value and not (host and port.isdigit() and 0 < int(port) < 65536 and RELAY_HOST.fullmatch(host)):
        raise InvalidInput(f"relay_address {value!r} is not host:port")
    return value


class RelayHalf(LearnerHalf):
    """Sends a fetch of the newest version to an actor that already fetches it, when the fetch offers the
    relay; enrols every fetch that names a relay address as a relay of that version."""

    def __init__(self, tree: RelayTree, count: Count) -> None:
        self._tree, self._count = tree, count

    def check(self, request: pb.FetchWeightsRequest) -> None:
        relay_address(request.relay_address)

    def answer(self, weights: WeightBlob, fetch: Fetch) -> Messages | None:
        peer = self._tree.source(weights.version, fetch.actor_id, fetch.request.relay_address,
                                 accept_peer=RELAY.source in fetch.offers)
        if peer is None:
            return None
        self._count("weight_fetches_relayed", 1)
        location = pb.PeerWeights(version=weights.version, address=peer.address, actor_id=peer.actor_id)
        return weights.messages[0], pb.WeightMessage(peer=location).SerializeToString(), weights.messages[-1]


def learner_half(config: ServiceConfig, count: Count) -> RelayHalf | None:
    """The half, unless server.weight_relay_fanout is 0."""
    fanout = config.server.weight_relay_fanout
    return RelayHalf(RelayTree(fanout), count) if fanout else None

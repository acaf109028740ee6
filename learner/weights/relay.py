"""Which actor relays a weight version to which: the learner's egress stays one version per publish
for actors off its host, however many fetch it (the relay tree).

The first actor that fetches the newest version over the stream gets the learner's chunks; every
later one is answered PeerWeights, naming an actor already fetching that version, whose relay server
(actors/weights/relay.py) forwards the chunks as they land: pipelined, so a chain never waits for a
whole copy. Each relay serves at most `fanout` actors, filled breadth first (in order of arrival),
so N actors sit log_fanout(N) deep. The header and commit always come from the learner, so a relay
can make a fetch fail but never change what is applied; the actor then asks the learner again with
accept_peer=False, gets the chunks, and the relay it was sent to is sent nobody else for that version.

Only the newest version has a tree (actors fetch the newest); a fetch of an older one is served by the
learner. An actor that fetches the same version again is served by the learner too: it may relay to
others already, and being sent to one of them would be a cycle.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass


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

"""The transports a weight version travels by: one table, read by both halves.

Every FetchWeights stream is header, blob, commit; the header and the commit always come from the
learner, and the transport decides only where the blob's bytes come from. The learner answers each
fetch with the first transport in TRANSPORTS that can serve it (learner/weights/transports.py); an
actor offers the bulk transports it can use in one call, and when the one it was answered with fails,
asks once more for the learner's own stream (actors/weights/transports.py). Each transport's halves
are files of one name: learner/weights/<file> sends it, actors/weights/<file> receives it.

| transport | answered with | learner half | actor half | serves |
| --- | --- | --- | --- | --- |
| shared memory | `SharedWeights` (a file) | `shared_memory.py` | `shared_memory.py` | an actor on the learner's host |
| relay | `PeerWeights` (an actor) | `relay.py` | `relay.py` | an actor another one relays the newest to |
| stream | `WeightChunk`s | `publisher.py` | `staging.py` | anyone: the others' fallback |

A new transport is a row here and a half on each side; a new kind of version (tandem_wire/weights/
manifest.py) travels by all of them unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Transport:
    """One row of the table."""

    source: str
    """what an actor counts a version that came this way as (ActorStats.weight_sources)"""
    part: str
    """the WeightMessage part by which the learner's answer names it"""
    failed: str | None
    """what an actor counts a failure of it as before it falls back to the stream; None: no fallback"""

    @property
    def bulk(self) -> bool:
        """Offered by the actor, and stood in for by the stream when it fails."""
        return self.failed is not None


SHARED_MEMORY = Transport("shared", "shared", "shared_failed")
RELAY = Transport("relayed", "peer", "relay_failed")
STREAM = Transport("streamed", "chunk", None)
TRANSPORTS = (SHARED_MEMORY, RELAY, STREAM)  # in the learner's order of preference

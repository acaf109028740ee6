"""The transports a weight version travels by: one table, read by both halves.

Every FetchWeights stream is header, blob, commit; the header and the commit always come from the
learner, and the transport decides only where the blob's bytes come from. An actor names the bulk
transports it offers in one call (the `tandem-weight-offers` header); the learner answers with the first
row of TRANSPORTS that serves the fetch and names it (the `tandem-weight-transport` header of its
answer); when that fails, the actor asks once more offering nothing: the learner's own stream.

Each row names the file of its two halves, prime-rl style: `learner/weights/<file>.py` sends it (its
`learner_half`), `actors/weights/<file>.py` receives it (its `actor_half`); a transport from outside
these packages (a plug-in, or a test's toy) names one `plugin` module that holds both. The learner's weight desk
(learner/weights/desk.py) and the actor's fetcher (actors/weights/fetcher.py) load the halves from this
table and dispatch through it: a new transport is a row `register`ed here and its two halves, nothing
else (tandem_wire/weights/README.md walks through one). A new kind of version (manifest.py) travels by
all of them unchanged.

| transport | answered with | file of both halves | serves |
| --- | --- | --- | --- |
| shared memory | `SharedWeights` (a file) | `shared_memory.py` | an actor on the learner's host |
| relay | `PeerWeights` (an actor) | `relay.py` | an actor another one relays the newest to |
| stream | `WeightChunk`s | `stream.py` | anyone: the others' fallback |
"""

from __future__ import annotations

from dataclasses import dataclass

OFFERS_METADATA_KEY = "tandem-weight-offers"  # request: the bulk transports offered, comma-separated
ANSWER_METADATA_KEY = "tandem-weight-transport"  # answer's initial metadata: the transport that serves it


@dataclass(frozen=True)
class Transport:
    """One row of the table."""

    source: str
    """its name: in both headers, and what an actor counts a version that came this way as
    (ActorStats.weight_sources)"""
    failed: str | None
    """what an actor counts a failure of it as before it falls back to the stream; None: no fallback"""
    file: str
    """the file name (no .py) of its halves in learner/weights/ and actors/weights/"""
    plugin: str | None = None
    """instead, an importable module that holds both halves"""

    @property
    def bulk(self) -> bool:
        """Offered by the actor, and stood in for by the stream when it fails."""
        return self.failed is not None

    def module(self, side: str) -> str:
        """The module of its `side` ("learner" or "actors") half."""
        return self.plugin or f"{side}.weights.{self.file}"


SHARED_MEMORY = Transport("shared", "shared_failed", "shared_memory")
RELAY = Transport("relayed", "relay_failed", "relay")
STREAM = Transport("streamed", None, "stream")
TRANSPORTS = [SHARED_MEMORY, RELAY, STREAM]  # in the learner's order of preference; the stream serves all


def register(transport: Transport) -> Transport:
    """Add a bulk transport, preferred over the stream and after the rows already there. Both sides read
    the table when they are built (a learner service, a learner client): register before that."""
    if not transport.bulk or "," in transport.source:
        raise ValueError(f"a registered transport is a bulk one with a name without commas: {transport}")
    if any(row.source == transport.source for row in TRANSPORTS):
        raise ValueError(f"a transport named {transport.source!r} is registered already")
    TRANSPORTS.insert(TRANSPORTS.index(STREAM), transport)
    return transport


def unregister(transport: Transport) -> None:
    """Remove a row `register` added."""
    if transport in (SHARED_MEMORY, RELAY, STREAM):
        raise ValueError(f"{transport.source} is built in")
    TRANSPORTS.remove(transport)


def named(name: str | None) -> Transport:
    """The row an answer names; the stream when it names none (or a row this side does not know)."""
    return next((row for row in TRANSPORTS if row.source == name), STREAM)


def offers_header(offers: tuple[Transport, ...]) -> tuple[tuple[str, str], ...]:
    """The request metadata that offers `offers` (none: the learner's stream)."""
    return ((OFFERS_METADATA_KEY, ",".join(row.source for row in offers)),) if offers else ()


def offered(header: str | None) -> frozenset[str]:
    """The names of the bulk transports a request's offers header names, unknown ones left out (the
    header's size is bounded by the server's metadata limit)."""
    names = set((header or "").split(","))
    return frozenset(row.source for row in TRANSPORTS if row.bulk and row.source in names)

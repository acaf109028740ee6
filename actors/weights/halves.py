"""What a transport's actor half is (tandem_wire/weights/transports.py names each one's file): what it
adds to a FetchWeights, and how the learner's answer by it reaches staging (actors/weights/staging.py).

A half is built once per learner client by its file's `actor_half(**options)`, with the options the
client was given (`shared_memory`: offer this host's shared memory; `relay`: this actor's relay server,
or None; `token_metadata`: the run token, for calls to other actors); None: this actor cannot use it.
The fetcher (actors/weights/fetcher.py) calls it from the fetching thread only.
"""

from __future__ import annotations

from collections.abc import Iterator

from actors.weights.staged import StagingWatcher
from tandem_wire import pb


class ActorHalf:
    """A transport's actor half; the defaults suit a transport whose answer is the learner's chunks."""

    shared_files = False
    """its answer may name a SharedWeights file, which staging maps and verifies in place"""

    def prepare(self, request: pb.FetchWeightsRequest, offered: bool) -> StagingWatcher | None:
        """Fill in this transport's fields of a FetchWeights (every call, `offered` or not); returns what
        should watch the version land, if anything."""
        return None

    def receive(self, answer: Iterator[pb.WeightMessage]) -> Iterator[pb.WeightMessage]:
        """The learner's answer by this transport as staging reads it: header, the blob, commit. Raise
        WeightTransferError (AnswerSuperseded: ask once more, the same way) when it cannot be read."""
        return answer


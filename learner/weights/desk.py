"""The learner's weight desk: publishes versions, lets each transport keep what it needs of them, and
answers fetches, all through the transport table (tandem_wire/weights/transports.py).

The service (learner/service/server.py) holds the gRPC surface and its locks and counts the bytes it
sends; everything about versions and transports is here. Each row of the table has a learner half
(learner/weights/halves.py says what one is), loaded from its file when the desk is built; a fetch is
answered by the first half, in the table's order, that serves it, and the last row, the stream, serves
every fetch.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from learner.weights.halves import Count, Fetch, LearnerHalf, Messages
from learner.weights.publisher import WeightBlob, WeightPublisher, pack_weights
from learner.weights.versions import INITIAL_VERSION, WeightVersions, check_initial_adapter
from tandem_wire import pb
from tandem_wire.weights.transports import TRANSPORTS, Transport, offered

if TYPE_CHECKING:
    from learner.schema import ServiceConfig


class WeightsNotHeld(LookupError):
    """A fetch of a version the learner does not hold (answered NOT_FOUND)."""


def load_half(transport: Transport, config: ServiceConfig, count: Count) -> LearnerHalf | None:
    """The learner half of `transport`, built by its file's `learner_half` (None: not served here)."""
    return importlib.import_module(transport.module("learner")).learner_half(config, count)


class WeightDesk:
    """Versions and their transports. `publish` and `discard` run under the service's lock; `pack`,
    `fetch` and `answer` run on the caller's thread (the publisher and each half guard their own state)."""

    def __init__(self, config: ServiceConfig, count: Count) -> None:
        """`count(name, amount)` adds to the service's counters (learner/service/accounting.py)."""
        self._config = config
        self._halves = [(row, half) for row in TRANSPORTS if (half := load_half(row, config, count)) is not None]
        self._publisher = WeightPublisher(on_drop=lambda weights: self._dropped(weights.version))
        self.versions = WeightVersions()  # which versions an actor may name

    @property
    def latest_version(self) -> int | None:
        """The newest version held, None before the first publish."""
        return self._publisher.latest_version

    def held(self, version: int = 0) -> WeightBlob:
        """The packed `version` (0: the newest), to look at; KeyError when it is not held."""
        weights = self._publisher.acquire(version)
        self._publisher.release(weights)
        return weights

    def pack(self, version: int, tensors: Iterable[tuple[str, np.ndarray]],
             adapter: Mapping[str, Any] | None = None) -> WeightBlob:
        """Serialise and checksum a version once (learner/weights/publisher.py), and let every transport keep
        what it needs of its bytes. Version 0 is the base itself: as an adapter it must be the zero update."""
        if adapter is not None and version == INITIAL_VERSION:
            tensors = list(tensors)
            check_initial_adapter(tensors)
        return pack_weights(version, tensors, self._config.weight_chunk_bytes, self._config.server.weight_digest,
                            keep=[half.packed for _, half in self._halves], adapter=adapter)

    def publish(self, weights: WeightBlob) -> None:
        """Make a packed version the newest, which fetches of version 0 get."""
        self._publisher.publish(weights)
        self.versions.published(weights.version)
        for _, half in self._halves:
            half.published(weights)

    def discard(self, weights: WeightBlob) -> None:
        """A packed version that will not be published: the transports let go of what they kept."""
        self._dropped(weights.version)

    def fetch(self, actor_id: str, request: pb.FetchWeightsRequest, offers_header: str | None) -> Fetch:
        """A FetchWeights, its transport fields checked by every half (InvalidInput when one is out of bounds)."""
        for _, half in self._halves:
            half.check(request)
        return Fetch(actor_id, offered(offers_header), request)

    @contextlib.contextmanager
    def answer(self, version: int, fetch: Fetch) -> Iterator[tuple[Transport, Messages]]:
        """The transport that serves `fetch` of `version` (0: the newest) and its stream, with the version
        held (not dropped) until the block ends; WeightsNotHeld when it is not held."""
        try:
            weights = self._publisher.acquire(version)
        except KeyError as error:
            raise WeightsNotHeld(error.args[0]) from None
        try:
            yield next((row, messages) for row, half in self._halves
                       if (messages := half.answer(weights, fetch)) is not None)
        finally:
            self._publisher.release(weights)

    def close(self) -> None:
        for _, half in self._halves:
            half.close()

    def _dropped(self, version: int) -> None:
        for _, half in self._halves:
            half.dropped(version)

"""The actor's weight fetcher: the plan of FetchWeights calls, their retries and the fallback, all through
the transport table (tandem_wire/weights/transports.py).

A fetch first offers, in one call, every bulk transport this actor can use (each row's actor half,
actors/weights/halves.py, built by its file); the learner answers by one of them or by its own chunks and
names which in the answer's `tandem-weight-transport` header, and that row's half hands the answer to
staging (actors/weights/staging.py), which verifies the whole version or raises. When the bulk call
fails, the fetch asks once more offering nothing: the learner's stream. A call the learner refuses for
lack of room (RESOURCE_EXHAUSTED) is tried again as the client's `retry` says; an answer superseded before
it was read (AnswerSuperseded) is asked for once more the same way. What came by which transport, and
what failed, is counted in `counts`, and each fetch returns the transport that served it.
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import grpc

from actors.weights.halves import ActorHalf
from actors.weights.staged import AnswerSuperseded, StagedWeights, Watchers, WeightTransferError
from actors.weights.staging import stage_weights
from tandem_wire import pb
from tandem_wire.weights.transports import ANSWER_METADATA_KEY, STREAM, TRANSPORTS, Transport, named, offers_header

log = logging.getLogger(__name__)

Metadata = tuple[tuple[str, str], ...]
Call = Callable[[pb.FetchWeightsRequest, Metadata], Any]
"""opens a FetchWeights call of the request (the client fills in its identity) with these extra headers"""
Retry = Callable[[grpc.RpcError, int], bool]
"""whether to call again after the `n`th refusal (0-based) of a call, after waiting if it says so"""


@dataclass(frozen=True)
class Fetched:
    """A staged version and the transport that served it."""

    staged: StagedWeights
    transport: Transport


def load_half(transport: Transport, **options: Any) -> ActorHalf | None:
    """The actor half of `transport`, built by its file's `actor_half` (None: this actor cannot use it)."""
    return importlib.import_module(transport.module("actors")).actor_half(**options)


def fetch_plan(usable: Iterable[Transport]) -> tuple[tuple[Transport, ...], ...]:
    """The calls a fetch tries in turn, each as the transports it offers: the bulk ones of `usable`, in the
    table's order, then none (the learner's stream). The last call's failure is the fetch's."""
    bulk = tuple(row for row in TRANSPORTS if row.bulk and row in set(usable))
    return ((bulk,) if bulk else ()) + ((),)


class WeightFetcher:
    """Fetches versions for one actor by the transports it can use. One fetch at a time."""

    def __init__(self, name: str, call: Call, retry: Retry, **options: Any) -> None:
        """`name`: the actor, for the log; `options`: what the halves are built with (halves.py)."""
        self._name, self._call, self._retry = name, call, retry
        self._halves = {row: half for row in TRANSPORTS if (half := load_half(row, **options)) is not None}
        self.counts = {name: 0 for row in TRANSPORTS for name in (row.source, row.failed) if name}

    def fetch(self, version: int = 0) -> Fetched:
        """Stage and verify `version` (0: the newest) by the plan; WeightTransferError when every call failed."""
        start = time.monotonic()
        plan = list(fetch_plan(self._halves))
        asked_again = False
        while True:
            via, outcome = self._answered(version, plan[0])
            if isinstance(outcome, StagedWeights):
                self.counts[via.source] += 1
                return Fetched(dataclasses.replace(outcome, transfer_s=time.monotonic() - start), via)
            if via.failed:
                self.counts[via.failed] += 1
            if isinstance(outcome, AnswerSuperseded) and not asked_again:
                asked_again = True  # the next answer names the newer version's
                continue
            plan.pop(0)
            if not plan:
                raise outcome
            log.warning("%s: weights (%s) failed, streaming them from the learner: %s", self._name, via.source,
                        outcome)

    def _answered(self, version: int, offers: tuple[Transport, ...]) -> tuple[Transport, StagedWeights | Exception]:
        """One call offering `offers`, made again while the learner refuses it and `retry` agrees."""
        refusals = 0
        while True:
            via, outcome = self._once(version, offers)
            refused = outcome.__cause__ if isinstance(outcome, WeightTransferError) else None
            if not (isinstance(refused, grpc.RpcError) and self._retry(refused, refusals)):
                return via, outcome
            refusals += 1

    def _once(self, version: int, offers: tuple[Transport, ...]) -> tuple[Transport, StagedWeights | Exception]:
        """One FetchWeights call: the transport that answered (the stream when none was named) and the staged
        version or the WeightTransferError that ended it."""
        request = pb.FetchWeightsRequest(version=version)
        watchers = tuple(watcher for row, half in self._halves.items()
                         if (watcher := half.prepare(request, row in offers)) is not None)
        call = self._call(request, offers_header(offers))
        via = named(dict(call.initial_metadata() or ()).get(ANSWER_METADATA_KEY))
        half = self._halves.get(via) or self._halves[STREAM]
        try:
            staged = stage_weights(half.receive(call), version, allow_shared=half.shared_files,
                                   watcher=Watchers(watchers) if watchers else None)
        except grpc.RpcError as error:
            failure = WeightTransferError(f"weight stream failed: {error.code().name}: {error.details()}")
            failure.__cause__ = error
            return via, failure
        except WeightTransferError as error:
            call.cancel()
            return via, error
        return via, staged

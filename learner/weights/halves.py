"""What a transport's learner half is (tandem_wire/weights/transports.py names each one's file): the
fields of a fetch it checks, and the moments the weight desk (learner/weights/desk.py) calls it at.

A half is built once per service by its file's `learner_half(config, count)` (None: this service does not
serve it, e.g. switched off in the config). `published`, `dropped` and `close` run under the service's
lock; `packed` runs on the publishing thread, `check` and `answer` on the fetching calls' threads, so a
half with state of its own guards it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from learner.weights.publisher import WeightBlob
from tandem_wire import pb

Messages = tuple[bytes, ...]
Count = Callable[[str, int], None]  # adds to one of the service's counters (learner/service/accounting.py)


@dataclass(frozen=True)
class Fetch:
    """What one FetchWeights asks for: who asks, the bulk transports it offers (their names), and the
    request, whose transport fields each half checks (`check`) and reads itself."""

    actor_id: str
    offers: frozenset[str]
    request: pb.FetchWeightsRequest


class LearnerHalf:
    """A transport's learner half; the defaults do nothing, so a half writes only the moments it needs."""

    def check(self, request: pb.FetchWeightsRequest) -> None:
        """Raise learner.wire_bounds.InvalidInput when a field of this transport is out of its bounds
        (every half checks every fetch, offered or not)."""

    def packed(self, weights: WeightBlob, blob: memoryview) -> WeightBlob:
        """A version was just packed and `blob` is its bytes, alive only now: keep what this transport
        needs of them (in `weights.extra`, under its name)."""
        return weights

    def published(self, weights: WeightBlob) -> None:
        """The version was published."""

    def answer(self, weights: WeightBlob, fetch: Fetch) -> Messages | None:
        """The serialised stream (header, blob, commit) that serves `fetch` of `weights` this way; None:
        this transport does not serve it."""
        return None

    def dropped(self, version: int) -> None:
        """`version` is no longer held (it was superseded, and no stream reads it), or was never published."""

    def close(self) -> None:
        """The service stops."""


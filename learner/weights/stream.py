"""The stream transport's learner half (tandem_wire/weights/transports.py): the learner's own chunks,
serialised once when the version was packed (learner/weights/publisher.py). It serves every fetch, so it
is the last row and the others' fallback."""

from __future__ import annotations

from typing import TYPE_CHECKING

from learner.weights.halves import Count, Fetch, LearnerHalf, Messages
from learner.weights.publisher import WeightBlob

if TYPE_CHECKING:
    from learner.schema import ServiceConfig


class StreamHalf(LearnerHalf):
    def answer(self, weights: WeightBlob, fetch: Fetch) -> Messages | None:
        return weights.messages


def learner_half(config: ServiceConfig, count: Count) -> StreamHalf:
    return StreamHalf()

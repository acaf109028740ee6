"""The stream transport's actor half (tandem_wire/weights/transports.py): the learner's own chunks, which
staging reads as they come (actors/weights/staging.py). Every actor can use it: the others' fallback."""

from __future__ import annotations

from actors.weights.halves import ActorHalf


class StreamHalf(ActorHalf):
    """Adds nothing to a fetch; the answer is read as it comes."""


def actor_half(**_: object) -> StreamHalf:
    return StreamHalf()

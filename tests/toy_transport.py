"""A toy weight transport, both halves in one module (tandem_wire/weights/README.md walks through it): the
courier. The learner writes each version it is asked for into a file in DIRECTORY and answers with a
SharedWeights naming the file; the actor reads the file and hands staging the chunks. Registered by
tests/test_weights_transports.py only, to show that a transport is a row and two halves."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

from actors.weights.halves import ActorHalf
from actors.weights.staged import WeightTransferError
from learner.weights.halves import Count, Fetch, LearnerHalf, Messages
from learner.weights.publisher import WeightBlob
from tandem_wire import pb
from tandem_wire.weights.transports import Transport

COURIER = Transport("couriered", "courier_failed", "toy_transport", plugin="toy_transport")  # both halves here
DIRECTORY = Path(tempfile.gettempdir())  # where the courier leaves its files
CHUNK_BYTES = 7  # the actor's chunks: small and odd, unlike the learner's


class CourierOut(LearnerHalf):
    def __init__(self) -> None:
        self.paths: list[Path] = []

    def answer(self, weights: WeightBlob, fetch: Fetch) -> Messages | None:
        if COURIER.source not in fetch.offers:
            return None
        chunks = [pb.WeightMessage.FromString(m).chunk.data for m in weights.messages[1:-1]]
        path = DIRECTORY / f"tandem-courier-{os.getpid()}-v{weights.version}"
        path.write_bytes(b"".join(chunks))
        self.paths.append(path)
        location = pb.SharedWeights(version=weights.version, path=str(path), total_bytes=weights.header.total_bytes)
        return weights.messages[0], pb.WeightMessage(shared=location).SerializeToString(), weights.messages[-1]

    def close(self) -> None:
        for path in self.paths:
            path.unlink(missing_ok=True)


class CourierIn(ActorHalf):
    def receive(self, answer: Iterator[pb.WeightMessage]) -> Iterator[pb.WeightMessage]:
        for message in answer:
            if message.WhichOneof("part") != "shared":
                yield message
                continue
            try:
                blob = Path(message.shared.path).read_bytes()
            except OSError as error:  # the fetcher asks the learner's stream instead
                raise WeightTransferError(f"the courier lost version {message.shared.version}: {error}") from None
            for start in range(0, len(blob), CHUNK_BYTES):
                chunk = pb.WeightChunk(version=message.shared.version, offset=start,
                                       data=blob[start:start + CHUNK_BYTES])
                yield pb.WeightMessage(chunk=chunk)



def learner_half(config: object, count: Count) -> CourierOut:
    return CourierOut()


def actor_half(**_: object) -> CourierIn:
    return CourierIn()

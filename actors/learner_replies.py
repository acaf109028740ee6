"""What the learner client (actors/learner_client.py) answers with and raises: a registration, the
prompts of a lease, and a learner that is busy or unreachable."""

from __future__ import annotations

from dataclasses import dataclass

import grpc


class LearnerUnavailable(ConnectionError):
    """The learner did not answer within the call timeout."""


class LearnerBusy(LearnerUnavailable, grpc.RpcError):
    """The learner refused a call RESOURCE_EXHAUSTED (at capacity) on every try. A LearnerUnavailable, so
    a loop that rides out an unavailable learner rides this out too, and the grpc.RpcError it ends in
    (`code()`, `details()`) for callers that tell refusals apart."""

    def __init__(self, message: str, code: grpc.StatusCode, details: str) -> None:
        super().__init__(message)
        self._code, self._details = code, details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


@dataclass(frozen=True)
class RegisterInfo:
    latest_version: int
    heartbeat_interval_s: float
    credits: int
    max_staleness: int


@dataclass(frozen=True)
class Prompt:
    """A prompt to sample, as leased from the learner: the actor's side of the wire message pb.Prompt
    (learner.service.prompt_source.Prompt is the learner's). An evaluator's prompts, never leased, have no key."""

    prompt_ids: list[int]
    """the tokens to sample from"""
    text: str
    """the prompt as text, for the reward functions"""
    metadata: dict[str, str]
    """what the reward functions need besides, e.g. the reference answer"""
    group_id: str = ""
    """the learner's key of the lease, which the sampled group answers; "" when not leased"""


@dataclass(frozen=True)
class LeaseReply:
    """What one LeasePrompts call got."""

    prompts: list[Prompt]
    exhausted: bool  # the dataset is finished and no lease is outstanding anywhere
    retry_after_s: float  # the learner's lease budget held prompts back: ask again after this (0 = no hint)

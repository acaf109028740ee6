"""Shared pieces of the wire tests: a tiny prompt dataset, valid scored groups, a running service."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator

import numpy as np

from actors.learner_client import LearnerClient, PromptLease
from learner.prompt_source import PromptSource
from learner.service import LearnerService, ServiceConfig
from tandem_wire import WIRE_VERSION, pb

VOCAB = 64
CAPABILITIES = {
    "engine": "test",
    "model_family": "qwen2",
    "max_model_len": 128,
    "group_size": 4,
    "host": "localhost",
}


def make_prompts(n: int, length: int = 5, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    return [
        {
            "prompt_ids": rng.integers(5, VOCAB, size=length).tolist(),
            "text": f"prompt {i}",
            "metadata": {"answer": str(i)},
        }
        for i in range(n)
    ]


def make_group(
    lease: PromptLease,
    actor_id: str,
    *,
    policy_version: int = 0,
    group_size: int = 4,
    tokens: int = 6,
    seed: int = 0,
) -> pb.ScoredGroup:
    """A valid ScoredGroup for a leased prompt (completion 0 is unscorable, the rest rewarded)."""
    rng = np.random.default_rng(seed)
    group = pb.ScoredGroup(
        wire_version=WIRE_VERSION,
        group_id=lease.group_id,
        actor_id=actor_id,
        policy_version=policy_version,
        prompt_token_ids=lease.prompt_ids,
        metadata=lease.metadata,
        timings=pb.Timings(sample_seconds=0.1, score_seconds=0.01, sampled_at=time.time()),
    )
    for i in range(group_size):
        completion = group.completions.add(
            token_ids=rng.integers(0, VOCAB, size=tokens).tolist(),
            logprobs=(-rng.random(tokens) * 3).astype(np.float32).tolist(),
            finish_reason=pb.FINISH_REASON_STOP,
            text=f"c{i}",
        )
        if i == 0:
            completion.unscorable_reason = "reward timed out"
        else:
            completion.reward = float(i % 2)
    return group


@contextlib.contextmanager
def running_service(
    prompts: PromptSource | None = None, address: str = "127.0.0.1:0", service: LearnerService | None = None,
    **config
) -> Iterator[tuple[LearnerService, str]]:
    """Start ``service`` (default: a new one over ``prompts`` with ``config``) and stop it afterwards."""
    config.setdefault("group_size", 4)
    config.setdefault("vocab_size", VOCAB)
    service = service or LearnerService(prompts or PromptSource(make_prompts(32)), ServiceConfig(**config))
    bound = service.start(address)
    try:
        yield service, bound
    finally:
        service.stop(grace=0)


def wait_until(predicate: Callable[[], bool], timeout: float = 10.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def connected_client(address: str, actor_id: str = "actor-0", **kwargs) -> LearnerClient:
    client = LearnerClient(address, actor_id, **kwargs)
    client.register(CAPABILITIES, weight_version=0)
    return client

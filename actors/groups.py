"""Turn engine samples and reward scores into wire ``ScoredGroup`` messages."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from actors.engine import Sample
from rewards.types import ScoreResult
from tandem_wire import WIRE_VERSION, pb

FINISH_REASONS = {"stop": pb.FINISH_REASON_STOP, "length": pb.FINISH_REASON_LENGTH,
                  "abort": pb.FINISH_REASON_ABORT}
PROMPT_TOO_LONG = "prompt_too_long"


def completion_message(sample: Sample, score: ScoreResult) -> pb.Completion:
    """One completion with its behaviour logprobs, the version that sampled each token, and either a reward
    or the reason it has none."""
    message = pb.Completion(token_ids=sample.token_ids, logprobs=sample.logprobs,
                            finish_reason=FINISH_REASONS[sample.finish_reason], text=sample.text,
                            token_versions=sample.versions)
    if score.reward is not None:
        message.reward = score.reward
    else:
        message.unscorable_reason = score.unscorable_reason or "unscorable"
    return message


def group_message(*, group_id: str, actor_id: str, policy_version: int, prompt_ids: Sequence[int],
                  metadata: Mapping[str, str], **fields) -> pb.ScoredGroup:
    """A wire group of one leased prompt; `fields` are the rest of ScoredGroup (completions, timings, ...)."""
    return pb.ScoredGroup(
        wire_version=WIRE_VERSION, group_id=group_id, actor_id=actor_id, policy_version=policy_version,
        prompt_token_ids=list(prompt_ids), metadata={str(k): str(v) for k, v in metadata.items()}, **fields)


def scored_group(*, group_id: str, actor_id: str, prompt_ids: Sequence[int], samples: Sequence[Sample],
                 scores: Sequence[ScoreResult], metadata: Mapping[str, str], sample_seconds: float,
                 score_seconds: float, sampled_at: float) -> pb.ScoredGroup:
    """The group of G completions sampled from one leased prompt; its ``policy_version`` is its oldest
    token's (what the learner's staleness bound counts)."""
    if len(samples) != len(scores):
        raise ValueError(f"{len(samples)} samples but {len(scores)} scores for group {group_id}")
    return group_message(
        group_id=group_id, actor_id=actor_id, policy_version=min(min(s.versions) for s in samples),
        prompt_ids=prompt_ids, metadata=metadata,
        completions=[completion_message(s, r) for s, r in zip(samples, scores, strict=True)],
        timings=pb.Timings(sample_seconds=sample_seconds, score_seconds=score_seconds, sampled_at=sampled_at))


def rejected_group(*, group_id: str, actor_id: str, policy_version: int, prompt_ids: Sequence[int],
                   metadata: Mapping[str, str], reason: str) -> pb.ScoredGroup:
    """A refusal (no completions) so the learner retires the prompt instead of leasing it again."""
    return group_message(group_id=group_id, actor_id=actor_id, policy_version=policy_version, prompt_ids=prompt_ids,
                         metadata=metadata, rejected_reason=reason)

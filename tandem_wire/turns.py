"""One turn of a multi-turn completion as both sides hold it (pb.Turn on the wire): the actor builds it
as the episode goes (actors/trajectory.py), the learner reads it back from a group (learner/service/
group_validation.py, which checks its bounds first)."""

from __future__ import annotations

from dataclasses import dataclass, field

from tandem_wire import pb


@dataclass
class TurnRecord:
    """Tokens sampled, then the environment's observation tokens."""

    sampled_tokens: int
    observation_tokens: int
    policy_version: int
    reward: float | None = None
    context_ids: list[int] = field(default_factory=list)  # set: this turn starts a new training sample

    def add_to(self, completion: pb.Completion) -> None:
        """Append this turn to `completion`'s turns."""
        turn = completion.turns.add(sampled_tokens=self.sampled_tokens, observation_tokens=self.observation_tokens,
                                    policy_version=self.policy_version, context_token_ids=self.context_ids)
        if self.reward is not None:
            turn.reward = self.reward

    @classmethod
    def of(cls, turn: pb.Turn) -> TurnRecord:
        """The turn a pb.Turn carries."""
        return cls(turn.sampled_tokens, turn.observation_tokens, turn.policy_version,
                   turn.reward if turn.HasField("reward") else None, list(turn.context_token_ids))

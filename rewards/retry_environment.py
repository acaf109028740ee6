"""The built-in environment ``answer_retry``: a wrong answer is told so and may try again.

On the demo's arithmetic (``<user>46-12<asst>``) an episode is up to ``rewards.environment.max_turns``
tries; each wrong reply gets the observation ``feedback`` as the next user message, or with
``reveal_answer`` the right answer itself, and the first right one ends the episode with reward 1 (0 if
no try was right). What RL can learn here that a single turn cannot show: to use the feedback, i.e. to
answer differently after a "no", or to take the answer the environment gave.
"""

from __future__ import annotations

from collections.abc import Mapping

from rewards.environments import Environment, Step, environment


@environment("answer_retry")
class AnswerRetry(Environment):
    """Exact match against the row's ``answer``; ``feedback`` (or the answer) after each wrong try."""

    def __init__(self, feedback: str = "no", reveal_answer: bool = False) -> None:
        super().__init__(feedback=feedback, reveal_answer=reveal_answer)
        self.feedback, self.reveal_answer = feedback, reveal_answer
        self.answer = ""

    def reset(self, row: Mapping[str, str]) -> None:
        self.answer = str(row["answer"]).strip()

    def step(self, reply: str) -> Step:
        if reply.strip() == self.answer:
            return Step(reward=1.0, done=True)
        return Step(observation=[{"role": "user", "content": self.answer if self.reveal_answer else self.feedback}])

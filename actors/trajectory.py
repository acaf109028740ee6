"""One multi-turn trajectory, token in and token out: the ids the engine sampled, exactly, and between
two turns the observation's ids, so the learner trains on the very tokens the policy saw.

The next turn's prompt is the previous one + the turn's sampled ids + the observation's ids. Those come
from the model's chat template: the text it renders after the conversation so far (the rest of the
assistant's end-of-turn marker the model did not sample, the observation messages, the generation
prompt), tokenized on its own; nothing sampled is ever re-tokenized. That needs a template that extends
a conversation's rendering byte for byte when messages are added. Where it does not (a template that
rewrites earlier turns, e.g. dropping their reasoning), the tokens so far cannot be continued without
fabricating tokens the policy never saw: the next turn starts a new training sample instead, its prompt
the whole conversation rendered afresh (``Turn.context_token_ids`` on the wire; counted as a split). A
template that refuses the observation outright (a role it has no place for) ends the trajectory
(``template_refused``). The trajectory's reward is the sum of its steps' so far.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import jinja2

from actors.engine import Sample
from actors.groups import FINISH_REASONS
from rewards.environments import Step
from rewards.spec import EnvironmentSpec
from tandem_wire import tandem_pb2 as pb
from tandem_wire.turns import TurnRecord

# Content no real message has, to find where the template puts a message's text.
_PROBE = "\x00tandem-probe\x00"


class TemplateRefused(Exception):
    """The chat template cannot render the conversation (e.g. a `tool` message to a template without that role)."""


class ObservationRenderer:
    """Observation messages → the token ids that continue a conversation, as the chat template renders them."""

    def __init__(self, tokenizer, tools: Sequence[Mapping] | None = None) -> None:
        """`tools`: the tool schemas the template gets (`tools=`), as the learner rendered the prompt with."""
        self.tokenizer, self.tools = tokenizer, list(tools) if tools else None
        # what the template writes after an assistant message's content (its end-of-turn marker)
        rendered = self._render([{"role": "user", "content": "?"}, {"role": "assistant", "content": _PROBE}])
        self.assistant_tail = rendered[rendered.rindex(_PROBE) + len(_PROBE):]

    def continuation(self, messages: Sequence[Mapping[str, str]], observation: Sequence[Mapping[str, str]],
                     last_sampled_id: int | None) -> list[int] | None:
        """Ids that follow the assistant's last turn (`messages` ends with it) when `observation` is added,
        through the generation prompt of the next assistant turn; None when the template does not extend
        the conversation's rendering byte for byte (raises TemplateRefused when it cannot render it at all).
        `last_sampled_id`: the turn's last token, which ends the turn when it is the start of the
        template's end-of-turn marker (an EOS sampled by the model)."""
        before = self._render(messages)
        after = self._render([*messages, *observation], add_generation_prompt=True)
        if not after.startswith(before) or not before.endswith(self.assistant_tail):
            return None
        tail = self.assistant_tail
        if last_sampled_id is not None:
            sampled = self.tokenizer.decode([last_sampled_id], skip_special_tokens=False)
            if sampled and tail.startswith(sampled):
                tail = tail[len(sampled):]
        return list(self.tokenizer.encode(tail + after[len(before):], add_special_tokens=False))

    def fresh_context(self, messages: Sequence[Mapping[str, str]]) -> list[int]:
        """The whole conversation rendered afresh through the next generation prompt, as the learner
        renders a prompt: the context of a new training sample where `continuation` found none."""
        try:
            ids = self.tokenizer.apply_chat_template(list(messages), tokenize=True, return_dict=False,
                                                     add_generation_prompt=True, tools=self.tools)
        except (jinja2.TemplateError, ValueError) as error:
            raise TemplateRefused(str(error)) from None
        return list(ids)

    def _render(self, messages: Sequence[Mapping[str, str]], add_generation_prompt: bool = False) -> str:
        try:
            return self.tokenizer.apply_chat_template(list(messages), tokenize=False, tools=self.tools,
                                                      add_generation_prompt=add_generation_prompt)
        except (jinja2.TemplateError, ValueError) as error:
            raise TemplateRefused(str(error)) from None


@dataclass
class Trajectory:
    """One of a group's G trajectories as it grows; `context` is the next turn's prompt: the current
    training sample's prompt (the group's, or the conversation rendered afresh after a split) and the
    tokens since."""

    prompt_ids: list[int]
    messages: list[dict[str, str]]  # the conversation so far, for the template's prefix check
    token_ids: list[int] = field(default_factory=list)  # everything after the prompt
    logprobs: list[float] = field(default_factory=list)  # 0 on observation tokens
    versions: list[int] = field(default_factory=list)  # each token's weight version (observations: the last turn's)
    texts: list[str] = field(default_factory=list)  # each turn's sampled text
    turns: list[TurnRecord] = field(default_factory=list)
    finish_reason: str = ""  # of the last turn: "stop" | "length" | "abort"
    ended: str = ""  # why it ended (Trajectory.apply_step)
    unscorable_reason: str | None = None
    tool_calls: int = 0
    tool_errors: int = 0
    splits: int = 0  # new training samples started where the template could not extend the tokens
    sample_prompt: list[int] | None = None  # the current sample's prompt after a split
    sample_start: int = 0  # where the current sample starts in token_ids

    @property
    def context(self) -> list[int]:
        prompt = self.prompt_ids if self.sample_prompt is None else self.sample_prompt
        return prompt + self.token_ids[self.sample_start:]

    @property
    def left_open(self) -> bool:
        """Ended by tandem's limits while the environment still holds the episode (it is to be closed);
        a done episode is forgotten by the environment, an unscorable one is gone with its failure."""
        return bool(self.ended) and self.ended not in ("done", "unscorable")

    @property
    def reward(self) -> float:
        return sum(turn.reward or 0.0 for turn in self.turns)

    def add_turn(self, sample: Sample, version: int) -> None:
        """The engine's sampled tokens for the next turn, with their behaviour logprobs and versions (`version`,
        the one served when the turn was submitted, for a sample the engine did not label); the turn's version
        is its oldest token's (a version loaded in flight moves the rest of the turn to it)."""
        starts_sample = self.sample_prompt is not None and self.sample_start == len(self.token_ids)
        versions = sample.versions or [version] * len(sample.token_ids)
        self.turns.append(TurnRecord(len(sample.token_ids), 0, min(versions),
                                     context_ids=list(self.sample_prompt) if starts_sample else []))
        self.token_ids += sample.token_ids
        self.logprobs += sample.logprobs
        self.versions += versions
        self.texts.append(sample.text)
        self.messages.append({"role": "assistant", "content": sample.text})
        self.finish_reason = sample.finish_reason

    def add_observation(self, observation: Sequence[Mapping[str, str]], ids: Sequence[int]) -> None:
        """The environment's answer to the last turn, as the ids that continue the context (loss mask 0)."""
        self.token_ids += ids
        self.logprobs += [0.0] * len(ids)
        self.versions += self.versions[-1:] * len(ids)
        self.messages += [dict(message) for message in observation]
        self.turns[-1].observation_tokens = len(ids)

    def split(self, observation: Sequence[Mapping[str, str]], context_ids: Sequence[int]) -> None:
        """The environment's answer to the last turn where the template cannot extend the tokens: the next
        turn starts a new training sample whose prompt is `context_ids` (the observation is in it)."""
        self.messages += [dict(message) for message in observation]
        self.sample_prompt, self.sample_start = list(context_ids), len(self.token_ids)
        self.splits += 1

    def end(self, why: str, unscorable_reason: str | None = None) -> None:
        self.ended = why
        self.unscorable_reason = unscorable_reason

    def apply_step(self, answer: Step | str, renderer: ObservationRenderer, spec: EnvironmentSpec,
                   max_model_len: int) -> bool:
        """The environment's answer to the last turn (a Step, or why it has none): True when the
        trajectory goes on (the observation is added, or a new sample starts, and `context` is the next
        turn's prompt), False when it ended (`ended` says why: done, unscorable, max_turns, tool_errors,
        template_refused, max_tokens or context, the engine's context length)."""
        if isinstance(answer, str):
            self.end("unscorable", answer)
            return False
        self.turns[-1].reward = answer.reward
        self.tool_calls += answer.tool_calls
        self.tool_errors += answer.tool_errors
        if answer.done:
            self.end("done")
            return False
        if len(self.turns) >= spec.max_turns:
            self.end("max_turns")
            return False
        if spec.max_tool_errors is not None and self.tool_errors > spec.max_tool_errors:
            self.end("tool_errors")
            return False
        try:
            ids = renderer.continuation(self.messages, answer.observation, self.token_ids[-1])
            fresh = None if ids is not None else renderer.fresh_context([*self.messages, *answer.observation])
        except TemplateRefused:
            self.end("template_refused")
            return False
        # the next turn needs room for the observation (or its new sample's prompt) and one sampled token
        added, context = (len(ids), len(self.context) + len(ids)) if fresh is None else (0, len(fresh))
        if len(self.token_ids) + added + 1 > spec.max_total_tokens or context + 1 > self._longest_sample(spec):
            self.end("max_tokens")
            return False
        if context + 1 > max_model_len:
            self.end("context")
            return False
        if fresh is None:
            self.add_observation(answer.observation, ids)
        else:
            self.split(answer.observation, fresh)
        return True

    def _longest_sample(self, spec: EnvironmentSpec) -> int:
        """The longest training sample the learner takes from a trajectory: its prompt + max_total_tokens
        (a sample that a split starts holds the conversation so far, which may be longer than that)."""
        return len(self.prompt_ids) + spec.max_total_tokens

    def turn_budget(self, max_tokens: int, spec: EnvironmentSpec, max_model_len: int) -> int:
        """Tokens the next turn may sample: max_tokens, within the episode's budget, the longest sample
        and the context."""
        return min(max_tokens, spec.max_total_tokens - len(self.token_ids), max_model_len - len(self.context),
                   self._longest_sample(spec) - len(self.context))

    def completion(self) -> pb.Completion:
        """The trajectory on the wire: every token after the prompt, its turns, and the summed reward
        (or why it has none)."""
        message = pb.Completion(token_ids=self.token_ids, logprobs=self.logprobs,
                                finish_reason=FINISH_REASONS[self.finish_reason], text="".join(self.texts),
                                token_versions=self.versions)
        for turn in self.turns:
            turn.add_to(message)
        if self.unscorable_reason is None:
            message.reward = self.reward
        else:
            message.unscorable_reason = self.unscorable_reason
        return message

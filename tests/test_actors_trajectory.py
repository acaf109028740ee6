"""Token-in, token-out trajectories: the observation's ids continue the context exactly as the chat
template renders the whole conversation, sampled tokens are never re-tokenized, a template that rewrites
earlier turns starts a new training sample rather than papering over it, and the wire message tiles the
tokens by turn."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from actors.engine import Sample
from actors.trajectory import ObservationRenderer, Trajectory
from learner.data import chat_template_ids
from learner.service.group_validation import GroupLimits, parse_group
from models.tokenizer import build_char_tokenizer, build_chatml_tokenizer
from rewards.environments import Step
from rewards.spec import EnvironmentSpec
from tandem_wire import WIRE_VERSION
from tandem_wire import tandem_pb2 as pb


@pytest.fixture(scope="module", params=["char", "chatml"])
def tokenizer(request, tmp_path_factory):
    out = tmp_path_factory.mktemp(request.param)
    (build_char_tokenizer if request.param == "char" else build_chatml_tokenizer)(out)
    return AutoTokenizer.from_pretrained(out)


def _sampled(tokenizer, text: str) -> Sample:
    """What the engine returns for a turn that ends with the model's EOS: the text without it."""
    ids = tokenizer.encode(text, add_special_tokens=False) + [tokenizer.eos_token_id]
    return Sample(ids, [-0.5] * len(ids), "stop", text)


USER = [{"role": "user", "content": "46-12"}]
FEEDBACK = [{"role": "user", "content": "no"}]


def _after_first_turn(tokenizer, version: int = 3) -> tuple[list[int], Trajectory]:
    """The prompt of `46-12` and its trajectory after a first turn `58` (ended by the model's EOS)."""
    prompt = chat_template_ids(tokenizer, USER, add_generation_prompt=True)
    trajectory = Trajectory(list(prompt), [dict(m) for m in USER])
    trajectory.add_turn(_sampled(tokenizer, "58"), version=version)
    return prompt, trajectory


def test_two_turns_give_the_templates_rendering_of_the_whole_conversation(tokenizer):
    renderer = ObservationRenderer(tokenizer)
    user, feedback = USER, FEEDBACK
    prompt, trajectory = _after_first_turn(tokenizer)
    ids = renderer.continuation(trajectory.messages, feedback, trajectory.token_ids[-1])
    trajectory.add_observation(feedback, ids)
    trajectory.add_turn(_sampled(tokenizer, "34"), version=4)
    trajectory.turns[-1].reward = 1.0

    conversation = [*user, {"role": "assistant", "content": "58"}, *feedback, {"role": "assistant", "content": "34"}]
    expected = chat_template_ids(tokenizer, conversation)
    # the template's rendering ends the last turn with its whole end-of-turn marker; the model stopped at EOS
    assert trajectory.context == expected[:len(trajectory.context)]
    assert tokenizer.decode(expected[len(trajectory.context):], skip_special_tokens=False) == \
        renderer.assistant_tail[len(tokenizer.eos_token):]
    first = len(tokenizer.encode("58", add_special_tokens=False)) + 1
    assert [t.sampled_tokens for t in trajectory.turns] == [first, 3]
    assert trajectory.turns[0].observation_tokens == len(ids) and trajectory.turns[1].observation_tokens == 0
    assert trajectory.logprobs[first:first + len(ids)] == [0.0] * len(ids)

    message = pb.ScoredGroup(wire_version=WIRE_VERSION, group_id="g", actor_id="a", policy_version=3,
                             prompt_token_ids=prompt, completions=[trajectory.completion()])
    record = parse_group(message, GroupLimits(latest_version=4, vocab_size=len(tokenizer)))
    [completion] = record.completions
    assert completion.reward == 1.0 and completion.text == "5834"
    assert completion.loss_mask.tolist() == [1.0] * first + [0.0] * len(ids) + [1.0] * 3
    assert [(t.policy_version, t.reward) for t in completion.turns] == [(3, None), (4, 1.0)]
    assert completion.versions == [3] * (first + len(ids)) + [4] * 3


def test_a_turn_continued_across_a_weight_load_carries_each_tokens_version(tokenizer):
    """weight_update=keep: version 5 loads while the second turn is sampled; the turn is as old as its oldest
    token, the observation before it carries the first turn's version, and the learner takes the versions."""
    renderer = ObservationRenderer(tokenizer)
    prompt, trajectory = _after_first_turn(tokenizer)
    ids = renderer.continuation(trajectory.messages, FEEDBACK, trajectory.token_ids[-1])
    trajectory.add_observation(FEEDBACK, ids)
    second = _sampled(tokenizer, "34")
    second.versions = [4, 5, 5]
    trajectory.add_turn(second, version=4)
    trajectory.turns[-1].reward = 1.0
    message = pb.ScoredGroup(wire_version=WIRE_VERSION, group_id="g", actor_id="a", policy_version=3,
                             prompt_token_ids=prompt, completions=[trajectory.completion()])
    [completion] = parse_group(message, GroupLimits(latest_version=5, vocab_size=len(tokenizer))).completions
    first = trajectory.turns[0].sampled_tokens
    assert completion.versions == [3] * (first + len(ids)) + [4, 5, 5]
    assert [t.policy_version for t in completion.turns] == [3, 4]


class _RewritingTemplate:
    """A tokenizer whose template drops earlier assistant turns (as reasoning templates drop thoughts)."""

    def __init__(self, tokenizer):
        self.inner = tokenizer

    def apply_chat_template(self, messages, add_generation_prompt=False, **kwargs):
        last_user = max(i for i, m in enumerate(messages) if m["role"] == "user")
        kept = [m for i, m in enumerate(messages) if m["role"] != "assistant" or i > last_user]
        return self.inner.apply_chat_template(kept, add_generation_prompt=add_generation_prompt, **kwargs)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def test_a_template_that_rewrites_earlier_turns_starts_a_new_sample_from_the_conversation_rendered_afresh(tokenizer):
    rewriting = _RewritingTemplate(tokenizer)
    renderer = ObservationRenderer(rewriting)
    user, feedback = USER, FEEDBACK
    prompt, trajectory = _after_first_turn(tokenizer)
    assert renderer.continuation(trajectory.messages, feedback, trajectory.token_ids[-1]) is None
    spec = EnvironmentSpec(ref="answer_retry", max_turns=4, max_total_tokens=64)
    assert trajectory.apply_step(Step(observation=feedback), renderer, spec, max_model_len=128)
    # the next turn's prompt is the conversation as the template renders it now (the first reply dropped)
    fresh = chat_template_ids(rewriting, [*user, {"role": "assistant", "content": "58"}, *feedback],
                              add_generation_prompt=True)
    assert trajectory.context == fresh and trajectory.splits == 1
    assert trajectory.turn_budget(64, spec, 128) == min(64 - len(trajectory.token_ids), 128 - len(fresh),
                                                        len(prompt) + 64 - len(fresh))
    trajectory.add_turn(_sampled(tokenizer, "34"), version=4)
    trajectory.turns[-1].reward = 1.0
    whole = chat_template_ids(rewriting, [*user, {"role": "assistant", "content": "58"}, *feedback,
                                          {"role": "assistant", "content": "34"}])
    assert trajectory.context == whole[:len(trajectory.context)]  # the sample is what the template renders

    message = pb.ScoredGroup(wire_version=WIRE_VERSION, group_id="g", actor_id="a", policy_version=3,
                             prompt_token_ids=prompt, completions=[trajectory.completion()])
    limits = GroupLimits(latest_version=4, vocab_size=len(tokenizer), max_sequence_tokens=len(prompt) + 64)
    [completion] = parse_group(message, limits).completions
    first = len(tokenizer.encode("58", add_special_tokens=False)) + 1
    assert [(t.observation_tokens, t.context_ids) for t in completion.turns] == [(0, []), (0, fresh)]
    assert completion.samples(prompt) == [(prompt, 0, first), (fresh, first, first + 3)]
    assert completion.loss_mask.tolist() == [1.0] * (first + 3) and completion.reward == 1.0

    # a new sample may not outgrow the learner's longest row (the prompt + max_total_tokens)
    _, short = _after_first_turn(tokenizer)
    tight = EnvironmentSpec(ref="answer_retry", max_turns=4, max_total_tokens=len(short.token_ids) + 1)
    long_feedback = [{"role": "user", "content": "no" * 6}]
    longer = renderer.fresh_context([*short.messages, *long_feedback])
    assert len(longer) + 1 > len(prompt) + tight.max_total_tokens  # the token budget alone allows a turn
    assert not short.apply_step(Step(observation=long_feedback), renderer, tight, max_model_len=128)
    assert short.ended == "max_tokens" and short.splits == 0


def test_a_template_that_refuses_the_observation_ends_the_trajectory(tokenizer):
    """The character tokenizer's template has no `tool` role (ChatML takes any): refused, not a crash."""
    renderer = ObservationRenderer(tokenizer)
    _, trajectory = _after_first_turn(tokenizer)
    spec = EnvironmentSpec(ref="answer_retry", max_turns=4, max_total_tokens=64)
    goes_on = trajectory.apply_step(Step(observation=[{"role": "tool", "content": "34"}]), renderer, spec, 128)
    refuses = tokenizer.eos_token == "<eos>"
    assert goes_on != refuses and trajectory.ended == ("template_refused" if refuses else "")
    assert trajectory.splits == 0


@pytest.mark.parametrize(("answer", "spec", "ended"), [
    (Step(reward=1.0, done=True), {}, "done"),
    ("environment:timeout", {}, "unscorable"),
    (Step(observation=[{"role": "user", "content": "no"}]), {"max_turns": 1}, "max_turns"),
    (Step(observation=[{"role": "user", "content": "no"}], tool_calls=1, tool_errors=1), {"max_tool_errors": 0},
     "tool_errors"),
    (Step(observation=[{"role": "user", "content": "no"}]), {"max_total_tokens": 6}, "max_tokens"),
    (Step(observation=[{"role": "user", "content": "no"}]), {"max_model_len": 12}, "context"),
    (Step(observation=[{"role": "user", "content": "no"}], tool_calls=1, tool_errors=1), {}, ""),
])
def test_each_stop_condition_ends_the_trajectory_with_its_reason_and_nothing_dangling(tokenizer, answer, spec, ended):
    """After the first turn (3 tokens: '5', '8', EOS) of `<bos><user>46-12<asst>`-like prompts."""
    settings = {"max_turns": 4, "max_total_tokens": 64, "max_model_len": 64, **spec}
    max_model_len = settings.pop("max_model_len")
    environment = EnvironmentSpec(ref="answer_retry", **settings)
    _, trajectory = _after_first_turn(tokenizer, version=0)
    goes_on = trajectory.apply_step(answer, ObservationRenderer(tokenizer), environment, max_model_len)
    assert goes_on == (ended == "") and trajectory.ended == ended
    if goes_on:  # the observation is in, and the next turn has room
        assert trajectory.turns[-1].observation_tokens > 0 and trajectory.tool_errors == 1
        assert trajectory.turn_budget(16, environment, max_model_len) >= 1
    else:  # nothing observed after the last turn: the wire's rule
        assert trajectory.turns[-1].observation_tokens == 0
    assert trajectory.completion().HasField("unscorable_reason") == (ended == "unscorable")


TOOLS_HEADER = ("{% if tools %}<|im_start|>system\n<tools>{% for tool in tools %}{{ tool | tojson }}{% endfor %}"
                "</tools><|im_end|>\n{% endif %}")


def test_an_environments_tools_reach_every_chat_template_of_the_run(tmp_path, monkeypatch):
    """The calculator of docs/environments.md: its tool schemas go to the template's `tools=` for the
    learner's prompt, each observation's continuation and a split's fresh context alike, so the
    continuation stays a byte-for-byte extension of what the template renders with them."""
    from environment_helpers import page_calculator_spec

    from launch.config import load_config
    from models.tokenizer import CHATML_TEMPLATE
    from rewards.tools import template_tools, tool_schema

    spec = page_calculator_spec(tmp_path, monkeypatch)
    import page_envs

    schemas = template_tools(spec)
    assert schemas == [tool_schema(page_envs.calculate)]
    explicit = spec.environment.model_copy(update={"tools": []})
    assert template_tools(spec.model_copy(update={"environment": explicit})) is None
    config = load_config(None, ["rewards.imports=[page_envs]", "rewards.environment.ref=calculator"])
    assert config.rewards.template_tools() == schemas
    assert config.actor_config(tmp_path).environment.tools == schemas  # the actors need not import it

    out = tmp_path / "chatml"
    build_chatml_tokenizer(out)
    tokenizer = AutoTokenizer.from_pretrained(out)
    tokenizer.chat_template = TOOLS_HEADER + CHATML_TEMPLATE
    user = [{"role": "user", "content": "46-12?"}]
    prompt = chat_template_ids(tokenizer, user, add_generation_prompt=True, tools=schemas)
    assert '"name": "calculate"' in tokenizer.decode(prompt)
    renderer = ObservationRenderer(tokenizer, schemas)
    trajectory = Trajectory(list(prompt), [dict(m) for m in user])
    call = '<tool_call>{"name": "calculate", "arguments": {"expression": "46-12"}}</tool_call>'
    trajectory.add_turn(_sampled(tokenizer, call), version=0)
    result = [{"role": "tool", "content": "34"}]
    trajectory.add_observation(result, renderer.continuation(trajectory.messages, result, trajectory.token_ids[-1]))
    assert trajectory.context == chat_template_ids(tokenizer, trajectory.messages, add_generation_prompt=True,
                                                   tools=schemas)
    assert renderer.fresh_context(trajectory.messages) == trajectory.context

"""Token-in, token-out trajectories: the observation's ids continue the context exactly as the chat
template renders the whole conversation, sampled tokens are never re-tokenized, a template that rewrites
earlier turns is refused rather than papered over, and the wire message tiles the tokens by turn."""

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


def test_two_turns_give_the_templates_rendering_of_the_whole_conversation(tokenizer):
    renderer = ObservationRenderer(tokenizer)
    user = [{"role": "user", "content": "46-12"}]
    prompt = chat_template_ids(tokenizer, user, add_generation_prompt=True)
    trajectory = Trajectory(list(prompt), [dict(m) for m in user])
    trajectory.add_turn(_sampled(tokenizer, "58"), version=3)
    feedback = [{"role": "user", "content": "no"}]
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

    message = pb.ScoredGroup(wire_version=pb.WIRE_VERSION_1, group_id="g", actor_id="a", policy_version=3,
                             prompt_token_ids=prompt, completions=[trajectory.completion()])
    record = parse_group(message, GroupLimits(latest_version=4, vocab_size=len(tokenizer)))
    [completion] = record.completions
    assert completion.reward == 1.0 and completion.text == "5834"
    assert completion.loss_mask.tolist() == [1.0] * first + [0.0] * len(ids) + [1.0] * 3
    assert [(t.policy_version, t.reward) for t in completion.turns] == [(3, None), (4, 1.0)]


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


def test_a_template_that_rewrites_earlier_turns_is_a_break_not_a_fabrication(tokenizer):
    renderer = ObservationRenderer(_RewritingTemplate(tokenizer))
    messages = [{"role": "user", "content": "46-12"}, {"role": "assistant", "content": "58"}]
    assert renderer.continuation(messages, [{"role": "user", "content": "no"}], tokenizer.eos_token_id) is None
    # a role the template refuses (the character tokenizer's has no `tool`; ChatML takes any) is a break
    # too, not a crash
    tool = [{"role": "tool", "content": "34"}]
    refused = ObservationRenderer(tokenizer).continuation(messages, tool, tokenizer.eos_token_id)
    assert (refused is None) == (tokenizer.eos_token == "<eos>")


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
    prompt = chat_template_ids(tokenizer, [{"role": "user", "content": "46-12"}], add_generation_prompt=True)
    trajectory = Trajectory(list(prompt), [{"role": "user", "content": "46-12"}])
    trajectory.add_turn(_sampled(tokenizer, "58"), version=0)
    goes_on = trajectory.apply_step(answer, ObservationRenderer(tokenizer), environment, max_model_len)
    assert goes_on == (ended == "") and trajectory.ended == ended
    if goes_on:  # the observation is in, and the next turn has room
        assert trajectory.turns[-1].observation_tokens > 0 and trajectory.tool_errors == 1
        assert trajectory.turn_budget(16, environment, max_model_len) >= 1
    else:  # nothing observed after the last turn: the wire's rule
        assert trajectory.turns[-1].observation_tokens == 0
    assert trajectory.completion().HasField("unscorable_reason") == (ended == "unscorable")

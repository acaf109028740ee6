"""Environments in their isolated child: episodes keep their state between steps, and an environment
that raises, hangs, kills its process or answers with something that is not a Step ends only its own
episode, with a reason (never a silent 0); the next episode is served by a fresh child. Tools: plain
functions with their schema, run on the calls a reply makes, their failures shown and counted."""

from __future__ import annotations

import sys
import textwrap

import pytest
from environment_helpers import page_calculator_spec
from misbehaviour_helpers import MISBEHAVE_ON

from rewards.environment_host import IsolatedEnvironment
from rewards.environments import Environment, Step, check_step, environment, resolve_environment
from rewards.spec import EnvironmentSpec, RewardSpec, WeightedReward
from rewards.tools import ToolEnvironment, tool_schema
from rewards.types import RewardStats

USER_MODULE = MISBEHAVE_ON + '''
import math
from rewards.environments import Environment, Step

class Misbehave(Environment):
    """Counts the turns; on the reply "raise", "hang", "exit", "segfault", "nan" or "junk" does that."""

    def reset(self, row):
        self.turns = 0

    def step(self, reply):
        self.turns += 1
        misbehave_on(reply, KeyError)
        if reply == "nan":
            return Step(reward=math.nan, done=True)
        if reply == "junk":
            return {"reward": 1.0}
        return Step(observation=[{"role": "tool", "content": str(self.turns)}], reward=0.5, done=self.turns == 3)
'''


@pytest.fixture
def host(tmp_path, monkeypatch):
    (tmp_path / "user_environments.py").write_text(textwrap.dedent(USER_MODULE))
    monkeypatch.syspath_prepend(str(tmp_path))
    spec = RewardSpec(functions=[WeightedReward(ref="exact_match")], timeout_s=1.0,
                      environment=EnvironmentSpec(ref="user_environments:Misbehave"))
    host = IsolatedEnvironment(spec)
    yield host
    host.shutdown()


def test_episodes_keep_their_own_state_between_steps(host):
    assert host.reset("a", {}) is None and host.reset("b", {}) is None
    assert host.step("a", "x").observation == ({"role": "tool", "content": "1"},)
    assert host.step("a", "x").observation == ({"role": "tool", "content": "2"},)
    assert host.step("b", "x").observation == ({"role": "tool", "content": "1"},)
    last = host.step("a", "x")
    assert last.done and last.reward == 0.5 and last.observation == ()
    assert host.step("a", "x") == "environment:lost"  # a finished episode is forgotten
    assert host.stats() == RewardStats(failures={"environment:lost": 1}, episodes=2, steps=5)


@pytest.mark.parametrize(("reply", "reason", "restarts"), [
    ("raise", "environment:raised:KeyError", 0), ("hang", "environment:timeout", 1),
    ("exit", "environment:crashed", 1), ("segfault", "environment:crashed", 1),
    ("nan", "environment:non_finite_reward", 0), ("junk", "environment:wrong_type:dict", 0)])
def test_a_failing_step_ends_only_its_episode_with_a_reason(host, reply, reason, restarts):
    host.reset("bad", {})
    host.reset("good", {})
    assert host.step("bad", reply) == reason
    assert host.stats().restarts == restarts
    # a killed child took the other episodes with it: they are lost, never scored 0
    assert host.step("good", "x") == ("environment:lost" if restarts else
                                      Step(({"role": "tool", "content": "1"},), 0.5, False))
    host.reset("next", {})
    assert host.step("next", "x").reward == 0.5  # the (fresh) child serves new episodes


def test_a_missing_environment_fails_at_start_naming_it(tmp_path):
    spec = RewardSpec(functions=[WeightedReward(ref="exact_match")], environment=EnvironmentSpec(ref="nowhere"))
    with pytest.raises(Exception, match="unknown environment 'nowhere'"):
        IsolatedEnvironment(spec)


def test_steps_are_checked_and_registration_is_by_name():
    with pytest.raises(ValueError, match="empty_observation"):
        check_step(Step())
    with pytest.raises(ValueError, match="bad_observation_role_or_content"):
        check_step(Step(observation=[{"role": "assistant", "content": "x"}]))
    with pytest.raises(ValueError, match="bad_tool_counts"):
        check_step(Step(done=True, tool_calls=1, tool_errors=2))
    assert check_step(Step(done=True, reward=1)).reward == 1.0

    @environment("test_echo")
    class Echo(Environment):
        def step(self, reply):
            return Step(done=True)

    assert resolve_environment("test_echo") is Echo
    assert resolve_environment("answer_retry").__name__ == "AnswerRetry"  # built-in, found by name
    with pytest.raises(TypeError):
        environment("test_not_a_class")(len)
    with pytest.raises(ValueError, match="already registered"):
        environment("test_echo")(type("Other", (Environment,), {}))
    assert sys.modules["rewards.retry_environment"]


def calculate(expression: str, digits: int = 0) -> str:
    """The value of an integer expression with + - *.

    Anything else is an error."""
    if not set(expression) <= set("0123456789+-* "):
        raise ValueError(f"not an integer expression: {expression!r}")
    return str(round(eval(expression), digits))  # noqa: S307 - checked to digits and + - * above


class Calculator(ToolEnvironment):
    tools = (calculate,)

    def reset(self, row):
        self.expected = row["answer"]

    def answer(self, reply):
        return Step(reward=float(reply.strip() == self.expected), done=True)


def test_a_tool_is_a_plain_function_with_its_json_schema():
    assert tool_schema(calculate) == {"type": "function", "function": {
        "name": "calculate", "description": "The value of an integer expression with + - *.",
        "parameters": {"type": "object", "required": ["expression"],
                       "properties": {"expression": {"type": "string"}, "digits": {"type": "integer"}}}}}
    with pytest.raises(TypeError, match="needs a type hint"):
        tool_schema(lambda x: x)


def test_tool_calls_are_run_and_their_failures_shown_to_the_model_and_counted():
    env = Calculator()
    env.reset({"answer": "34"})
    call = '<tool_call>{"name": "calculate", "arguments": {"expression": "46-12"}}</tool_call>'
    step = check_step(env.step(call))
    assert step.observation == ({"role": "tool", "content": "34"},) and (step.tool_calls, step.tool_errors) == (1, 0)
    bad = ('<tool_call>{"name": "calculate", "arguments": {"expression": "__import__(1)"}}</tool_call>'
           '<tool_call>{"name": "calculate", "arguments": {"expression": 4}}</tool_call>'
           '<tool_call>{"name": "calculate", "arguments": {"expr": "1"}}</tool_call>'
           '<tool_call>{"name": "shell", "arguments": {}}</tool_call><tool_call>{not json}</tool_call>'
           '<tool_call>["calculate"]</tool_call>')
    step = check_step(env.step(bad))
    assert (step.tool_calls, step.tool_errors) == (6, 6) and not step.done
    contents = [message["content"] for message in step.observation]
    assert contents[0].startswith("error: calculate raised ValueError: not an integer expression")
    assert contents[1] == "error: calculate: expression must be a JSON string"
    assert "missing a required argument: 'expression'" in contents[2] and "no tool 'shell'" in contents[3]
    assert "not JSON" in contents[4] and '"arguments": <object>' in contents[5]
    assert env.step(" 34 ") == Step(reward=1.0, done=True)  # no call: the final answer


def test_the_calculator_of_docs_environments_md_runs_as_written(tmp_path, monkeypatch):
    """The page's one-screen environment, taken from the page, in its isolated child."""
    host = IsolatedEnvironment(page_calculator_spec(tmp_path, monkeypatch))
    try:
        host.reset("k", {"answer": "34"})
        call = '<tool_call>{"name": "calculate", "arguments": {"expression": "46-12"}}</tool_call>'
        assert host.step("k", call).observation == ({"role": "tool", "content": "34"},)
        assert host.step("k", call.replace("46-12", "4/2")).tool_errors == 1
        assert host.step("k", "34") == Step(reward=1.0, done=True)
    finally:
        host.shutdown()

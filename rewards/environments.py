"""Environments: multi-turn episodes a user writes in messages, whose loop tandem owns.

An environment is a class; tandem makes one instance per trajectory (``cls(**kwargs)``, the settings
from ``rewards.environment.kwargs``), calls ``reset(row)`` with the leased prompt's row (its metadata:
the reference answer and every other column) and then ``step(reply)`` with each assistant turn's text,
until a step says ``done`` or a stop condition ends the episode (``max_turns``, the token budget, a
prompt grown past the engine's context). The first observation is the leased prompt itself, rendered
by the data section's chat format (its system prompt can describe the tools)::

    @environment("countdown")
    class Countdown(Environment):
        def reset(self, row):
            self.answer = row["answer"]

        def step(self, reply):
            if reply.strip() == self.answer:
                return Step(reward=1.0, done=True)
            return Step(observation=[{"role": "user", "content": "no"}])

A trajectory's reward is the sum of its steps' rewards. Environments run in an isolated child process
of each reward worker (rewards/environment_child.py) with the reward timeout per call: one that raises,
hangs, crashes or returns something that is not a valid ``Step`` makes its trajectory unscorable
(reason ``environment:<why>``), never a silent 0.
"""

from __future__ import annotations

import importlib
import math
import numbers
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from tandem_wire.conventions import import_reference

# Roles an observation message may have: the next user message or a tool's output.
OBSERVATION_ROLES = ("user", "tool")
# Modules whose import registers the built-in environments (imported on the first lookup by name).
_BUILTIN_MODULES = ("rewards.retry_environment",)
_REGISTRY: dict[str, type] = {}


@dataclass(frozen=True)
class Step:
    """An environment's answer to one assistant turn."""

    observation: Sequence[Mapping[str, str]] = ()
    """messages that follow the assistant's (roles in OBSERVATION_ROLES); ignored when done"""
    reward: float = 0.0
    """this turn's reward; the trajectory's is the sum over its turns"""
    done: bool = False
    """the episode is over (no observation is rendered)"""
    tool_calls: int = 0
    """tools the reply called (counted in the metrics)"""
    tool_errors: int = 0
    """of those, calls that failed (counted; the failure is the observation the model sees)"""
    info: Mapping[str, str] = field(default_factory=dict)
    """free-form notes (kept for the caller's logs, not sent to the learner)"""


class Environment:
    """Subclass and override ``reset`` and ``step`` (see the module docstring)."""

    def __init__(self, **settings: object) -> None:
        self.settings = settings

    def reset(self, row: Mapping[str, str]) -> None:
        """Start the episode of one trajectory of the leased prompt ``row``."""

    def step(self, reply: str) -> Step:
        """Answer the assistant's turn ``reply`` (its text, without the end-of-turn token)."""
        raise NotImplementedError(f"{type(self).__name__}.step")


class InvalidStep(ValueError):
    """``step`` returned something that is not a valid Step; the message is the unscorable reason."""


def check_step(value: object) -> Step:
    """``value`` if it is a valid Step, with plain-Python fields (it crosses a process boundary)."""
    if not isinstance(value, Step):
        raise InvalidStep(f"wrong_type:{type(value).__name__}")
    if isinstance(value.reward, bool) or not isinstance(value.reward, numbers.Real) or not math.isfinite(value.reward):
        raise InvalidStep("non_finite_reward" if isinstance(value.reward, numbers.Real) else "wrong_reward_type")
    if not isinstance(value.done, bool):
        raise InvalidStep("done_not_bool")
    messages = []
    for message in () if value.done else value.observation:
        if not isinstance(message, Mapping) or set(message) != {"role", "content"}:
            raise InvalidStep("observation_not_messages")
        if message["role"] not in OBSERVATION_ROLES or not isinstance(message["content"], str):
            raise InvalidStep("bad_observation_role_or_content")
        messages.append({"role": message["role"], "content": message["content"]})
    if not value.done and not messages:
        raise InvalidStep("empty_observation")
    counts = (value.tool_calls, value.tool_errors)
    if any(isinstance(n, bool) or not isinstance(n, int) or n < 0 for n in counts) or counts[1] > counts[0]:
        raise InvalidStep("bad_tool_counts")
    return Step(tuple(messages), float(value.reward), value.done, value.tool_calls, value.tool_errors,
                {str(k): str(v) for k, v in dict(value.info).items()})


def environment(name: str) -> Callable[[type], type]:
    """Class decorator registering an Environment subclass under ``name``."""
    if not name or ":" in name:
        raise ValueError(f"environment name must be non-empty and contain no ':', got {name!r}")

    def register(cls: type) -> type:
        if not (isinstance(cls, type) and issubclass(cls, Environment)):
            raise TypeError(f"@environment({name!r}) needs a subclass of rewards.environments.Environment")
        previous = _REGISTRY.get(name)
        where = f"{cls.__module__}.{cls.__qualname__}"
        if previous is not None and f"{previous.__module__}.{previous.__qualname__}" != where:
            raise ValueError(f"environment {name!r} is already registered by "
                             f"{previous.__module__}.{previous.__qualname__}")
        _REGISTRY[name] = cls
        return cls

    return register


def resolve_environment(ref: str) -> type:
    """The Environment class for ``ref``: a registered name, or ``"package.module:Class"``."""
    if ":" in ref:
        cls = import_reference(ref, "environment")
    else:
        if ref not in _REGISTRY:
            for module_name in _BUILTIN_MODULES:
                importlib.import_module(module_name)
        if ref not in _REGISTRY:
            raise ValueError(f"unknown environment {ref!r}; registered: {sorted(_REGISTRY)} "
                             "(or use 'package.module:Class')")
        cls = _REGISTRY[ref]
    if not (isinstance(cls, type) and issubclass(cls, Environment)):
        raise ValueError(f"environment {ref!r} is not a subclass of rewards.environments.Environment")
    return cls

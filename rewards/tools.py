"""Tools for environments: plain Python functions, their JSON schemas, and the calls a model writes.

A tool is a function with type hints and a docstring; ``tool_schema`` gives the function schema chat
templates and tool-calling models expect (``{"type": "function", "function": {name, description,
parameters}}``). Calls are read from a reply in the Hermes / Qwen2.5 form, one per tag::

    <tool_call>{"name": "calculate", "arguments": {"expression": "46-12"}}</tool_call>

``ToolEnvironment`` runs them: a reply with calls gets each result (or its error, which the model sees
and which is counted in ``Step.tool_errors``) as a ``tool`` message; a reply without one is the final
answer, scored by the subclass's ``answer``. Written here rather than taken from a library: the schema
and call format are a few lines, and the environment child should stay free of heavy imports.
"""

from __future__ import annotations

import importlib
import inspect
import json
import re
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from rewards.environments import Environment, Step, resolve_environment

_JSON_TYPES = {int: "integer", float: "number", str: "string", bool: "boolean", list: "array", dict: "object"}
_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


def tool_schema(fn: Callable) -> dict[str, Any]:
    """The function schema of `fn`: its name, the docstring's first paragraph, and one JSON-typed
    property per parameter (those without a default are required)."""
    hints = typing.get_type_hints(fn)
    properties, required = {}, []
    for name, parameter in inspect.signature(fn).parameters.items():
        annotation = hints.get(name)
        origin = typing.get_origin(annotation) or annotation
        if origin not in _JSON_TYPES:
            raise TypeError(f"tool {fn.__name__}: parameter {name!r} needs a type hint among "
                            f"{[t.__name__ for t in _JSON_TYPES]}, got {annotation!r}")
        properties[name] = {"type": _JSON_TYPES[origin]}
        if parameter.default is inspect.Parameter.empty:
            required.append(name)
    description = (inspect.getdoc(fn) or "").split("\n\n")[0].replace("\n", " ")
    return {"type": "function", "function": {
        "name": fn.__name__, "description": description,
        "parameters": {"type": "object", "properties": properties, "required": required}}}


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any]


class ToolCallError(ValueError):
    """A call that cannot be run; its message is what the model is told."""


def parse_tool_calls(reply: str) -> list[ToolCall | ToolCallError]:
    """Every ``<tool_call>{...}</tool_call>`` in `reply`, in order; one that is not a JSON object with a
    string ``name`` and an object ``arguments`` is a ToolCallError in its place."""
    calls: list[ToolCall | ToolCallError] = []
    for body in _CALL.findall(reply):
        try:
            call = json.loads(body)
        except json.JSONDecodeError as error:
            calls.append(ToolCallError(f"the tool call is not JSON ({error.msg})"))
            continue
        if not (isinstance(call, dict) and isinstance(call.get("name"), str)
                and isinstance(call.get("arguments", {}), dict)):
            calls.append(ToolCallError('a tool call is {"name": <string>, "arguments": <object>}'))
            continue
        calls.append(ToolCall(call["name"], call.get("arguments", {})))
    return calls


def _is_json_type(value: Any, expected: type) -> bool:
    """JSON's view: true is not an integer, and an integer is a number."""
    if isinstance(value, bool) != (expected is bool):
        return False
    return isinstance(value, (int, float)) if expected is float else isinstance(value, expected)


def template_tools(spec) -> list[dict[str, Any]] | None:
    """The tool schemas a run's chat template gets (`tools=`) for a `rewards.spec.RewardSpec`: its
    environment's `tools` setting, else a ToolEnvironment's own tools; None without tools. Imports the
    environment's module (after the spec's `imports`)."""
    environment = spec.environment
    if environment is None:
        return None
    if environment.tools is not None:
        return list(environment.tools) or None
    for module_name in spec.imports:
        importlib.import_module(module_name)
    cls = resolve_environment(environment.ref)
    return (cls.schemas() if issubclass(cls, ToolEnvironment) else None) or None


class ToolEnvironment(Environment):
    """An environment whose model may call ``tools`` before it answers; subclasses set ``tools`` and
    implement ``answer(reply) -> Step`` for a reply with no tool call."""

    tools: Sequence[Callable] = ()

    @classmethod
    def schemas(cls) -> list[dict[str, Any]]:
        """The tools' schemas (what a chat template's ``tools=`` takes)."""
        return [tool_schema(fn) for fn in cls.tools]

    def answer(self, reply: str) -> Step:
        raise NotImplementedError(f"{type(self).__name__}.answer")

    def step(self, reply: str) -> Step:
        calls = parse_tool_calls(reply)
        if not calls:
            return self.answer(reply)
        results = [self._run(call) for call in calls]
        errors = sum(isinstance(result, ToolCallError) for result in results)
        return Step(observation=[{"role": "tool", "content": f"error: {r}" if isinstance(r, ToolCallError) else r}
                                 for r in results], tool_calls=len(calls), tool_errors=errors)

    def _run(self, call: ToolCall | ToolCallError) -> str | ToolCallError:
        """The call's result as text, or the error the model is shown (a tool that raises is one)."""
        if isinstance(call, ToolCallError):
            return call
        tools = {fn.__name__: fn for fn in self.tools}
        fn = tools.get(call.name)
        if fn is None:
            return ToolCallError(f"no tool {call.name!r}; tools: {sorted(tools)}")
        try:
            inspect.signature(fn).bind(**call.arguments)
        except TypeError as error:
            return ToolCallError(f"{call.name}: {error}")
        hints = typing.get_type_hints(fn)
        for name, value in call.arguments.items():
            expected = typing.get_origin(hints[name]) or hints[name]
            if not _is_json_type(value, expected):
                return ToolCallError(f"{call.name}: {name} must be a JSON {_JSON_TYPES[expected]}")
        try:
            return str(fn(**call.arguments))
        except Exception as error:  # noqa: BLE001 - the model sees what went wrong, and it is counted
            return ToolCallError(f"{call.name} raised {type(error).__name__}: {error}")

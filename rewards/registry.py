"""Reward-function registry: ``@reward("name")`` and ``"package.module:function"`` references.

The documented signature of a reward function is::

    fn(prompt: str, completion: str, *, completion_ids: list[int], metadata: dict, **kwargs)
        -> float | None

``metadata`` is the prompt's metadata (for example the reference answer under ``"answer"``);
``kwargs`` are the per-function settings from the reward config. ``None`` means "no opinion"
and makes the completion unscorable (reason ``returned_none``), never reward 0.

Batched functions (``@reward("name", batched=True)``) take one call per group, with lists::

    fn(prompts: list[str], completions: list[str], *, completion_ids: list[list[int]],
       metadata: list[dict], **kwargs) -> list[float | None]

Either kind may be ``async def``; the reward worker awaits it.
"""

import importlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass

from tandem_wire.conventions import import_reference

# Modules whose import registers the built-in rewards; imported on the first lookup by name so that
# importing the registry stays cheap.
_BUILTIN_MODULES = ("rewards.answers", "rewards.shaping", "rewards.code_execution")

_REGISTRY: dict[str, Callable] = {}
_ATTRIBUTE = "__tandem_reward__"


@dataclass(frozen=True)
class RewardInfo:
    """How a reward function wants to be called."""

    name: str
    batched: bool
    is_async: bool


def reward(name: str, *, batched: bool = False) -> Callable[[Callable], Callable]:
    """Decorator registering ``fn`` under ``name`` (see the module docstring for the signature)."""
    if not name or ":" in name:
        raise ValueError(f"reward name must be non-empty and contain no ':', got {name!r}")

    def register(fn: Callable) -> Callable:
        previous = _REGISTRY.get(name)
        if previous is not None and _qualified_name(previous) != _qualified_name(fn):
            raise ValueError(f"reward {name!r} is already registered by {_qualified_name(previous)}")
        setattr(fn, _ATTRIBUTE, RewardInfo(name, batched, inspect.iscoroutinefunction(fn)))
        _REGISTRY[name] = fn
        return fn

    return register


def resolve(ref: str) -> Callable:
    """The function for ``ref``: a registered name, or ``"package.module:function"``."""
    if ":" in ref:
        return import_reference(ref, "reward")
    if ref not in _REGISTRY:
        for module_name in _BUILTIN_MODULES:
            importlib.import_module(module_name)
    try:
        return _REGISTRY[ref]
    except KeyError:
        raise ValueError(
            f"unknown reward {ref!r}; registered: {sorted(_REGISTRY)} (or use 'package.module:function')"
        ) from None


def info(fn: Callable, default_name: str) -> RewardInfo:
    """How to call ``fn``: from its ``@reward`` registration, else a plain per-completion function."""
    registered = getattr(fn, _ATTRIBUTE, None)
    if registered is not None:
        return registered
    return RewardInfo(default_name, batched=False, is_async=inspect.iscoroutinefunction(fn))


def _qualified_name(fn: Callable) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"

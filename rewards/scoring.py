"""Calling reward functions on a group, judging their return values and combining components.

A group's work is split into *units*, each one function call as the user wrote it: one unit per
completion for plain functions, one per group for batched ones. Async per-completion functions
form one unit too (their calls run concurrently, each under its own timeout). The isolated child
process runs units in order and reports each; its parent enforces the timeout per unit, so one
bad completion costs only its own unit.
"""

import asyncio
import logging
import math
import numbers
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from rewards.registry import info, resolve
from rewards.types import ScoreResult

log = logging.getLogger(__name__)

# (reward, None) or (None, reason)
Outcome = tuple[float | None, str | None]
TIMEOUT = "timeout"
CRASHED = "crashed"


@dataclass(frozen=True)
class Group:
    prompt: str
    completions: Sequence[tuple[str, list[int]]]  # (text, token ids)
    metadata: dict


@dataclass(frozen=True)
class Component:
    """A resolved reward function with its settings."""

    name: str
    fn: Callable
    kwargs: dict
    batched: bool
    is_async: bool

    @property
    def one_unit_per_group(self) -> bool:
        return self.batched or self.is_async


@dataclass(frozen=True)
class Unit:
    component: int
    completions: tuple[int, ...]


def load_components(functions: Sequence[tuple[str, str, dict]]) -> list[Component]:
    """Resolve ``(name, ref, kwargs)`` triples (imports user modules)."""
    components = []
    for name, ref, kwargs in functions:
        fn = resolve(ref)
        how = info(fn, name)
        components.append(Component(name, fn, dict(kwargs), how.batched, how.is_async))
    return components


def plan_units(one_unit_per_group: Sequence[bool], num_completions: int) -> list[Unit]:
    """The units of a group, in the order the child runs them."""
    everyone = tuple(range(num_completions))
    units = []
    for index, whole_group in enumerate(one_unit_per_group):
        if whole_group:
            units.append(Unit(index, everyone))
        else:
            units.extend(Unit(index, (i,)) for i in everyone)
    return units


def judge(value: object) -> Outcome:
    """A reward function's return value as an outcome: finite real numbers (bools included) score."""
    if value is None:
        return None, "returned_none"
    if not isinstance(value, numbers.Real):
        return None, f"wrong_type:{type(value).__name__}"
    value = float(value)
    return (value, None) if math.isfinite(value) else (None, "non_finite")


def run_unit(component: Component, unit: Unit, group: Group, timeout_s: float,
             loop: asyncio.AbstractEventLoop) -> list[Outcome]:
    """Call ``component`` for ``unit``; exceptions become ``raised:<type>`` outcomes."""
    try:
        if component.batched:
            return _batched(component, unit, group, timeout_s, loop)
        if component.is_async:
            results = loop.run_until_complete(_concurrently(component, unit, group, timeout_s))
            return [_exception_outcome(component, r) if isinstance(r, BaseException) else judge(r)
                    for r in results]
        (index,) = unit.completions
        return [judge(_call(component, group, index))]
    except Exception as error:  # noqa: BLE001 - any failure of user code is an outcome, not a crash
        return [_exception_outcome(component, error)] * len(unit.completions)


async def _concurrently(component: Component, unit: Unit, group: Group, timeout_s: float) -> list:
    calls = [asyncio.wait_for(_call(component, group, i), timeout_s) for i in unit.completions]
    return await asyncio.gather(*calls, return_exceptions=True)


def _call(component: Component, group: Group, index: int):
    text, ids = group.completions[index]
    return component.fn(group.prompt, text, completion_ids=ids, metadata=group.metadata, **component.kwargs)


def _batched(component: Component, unit: Unit, group: Group, timeout_s: float,
             loop: asyncio.AbstractEventLoop) -> list[Outcome]:
    size = len(unit.completions)
    values = component.fn(
        [group.prompt] * size,
        [text for text, _ in group.completions],
        completion_ids=[ids for _, ids in group.completions],
        metadata=[group.metadata] * size,
        **component.kwargs,
    )
    if component.is_async:
        values = loop.run_until_complete(asyncio.wait_for(values, timeout_s))
    if isinstance(values, (str, bytes, dict)) or not hasattr(values, "__iter__"):
        return [(None, f"wrong_type:{type(values).__name__}")] * size
    values = list(values)
    if len(values) != size:
        return [(None, "wrong_length")] * size
    return [judge(value) for value in values]


def _exception_outcome(component: Component, error: BaseException) -> Outcome:
    if isinstance(error, TimeoutError):
        return None, TIMEOUT
    log.warning("reward %s raised", component.name, exc_info=error)
    return None, f"raised:{type(error).__name__}"


def combine(names: Sequence[str], weights: Sequence[float], outcomes: Sequence[Sequence[Outcome]]
            ) -> list[ScoreResult]:
    """``reward = sum_k weight_k * r_k`` per completion; unscorable (``"<name>:<reason>"``, first
    failing component) if any component is. ``outcomes[k][i]``: component k, completion i."""
    results = []
    for per_component in zip(*outcomes, strict=True):
        named = list(zip(names, weights, per_component, strict=True))
        failed = [f"{name}:{reason}" for name, _, (_, reason) in named if reason is not None]
        if failed:
            results.append(ScoreResult(None, failed[0]))
        else:
            results.append(ScoreResult(math.fsum(weight * value for _, weight, (value, _) in named)))
    return results

"""What every floor agrees on besides the wire: how a `package.module:function` plug point resolves
(rewards, environments, policy losses, advantage rules), and when a reward counts as a pass (the learner's
pass_rate, the evaluator's pass@k). At the bottom, so that the learner's algorithm and the rewards both
read them without importing each other."""

from __future__ import annotations

import importlib
from collections.abc import Callable

# A completion "passes" when its reward exceeds this (the built-in answer rewards give 1 or 0).
PASS_THRESHOLD = 0.5


def import_reference(ref: str, kind: str) -> Callable:
    """The callable ``"package.module:attribute"`` names (a function or a class); `kind` names it in errors."""
    module_name, _, attribute = ref.partition(":")
    module = importlib.import_module(module_name)
    try:
        fn = getattr(module, attribute)
    except AttributeError:
        raise ValueError(f"{kind} {ref!r}: {module_name!r} has no attribute {attribute!r}") from None
    if not callable(fn):
        raise ValueError(f"{kind} {ref!r} is not callable")
    return fn

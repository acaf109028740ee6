"""``code_execution``: run a completion's Python code against the prompt's tests in the sandbox."""

import json
import re

from rewards.registry import reward
from rewards.sandbox import SandboxLimits, SandboxResult, run_python

_FENCED = re.compile(r"```[ \t]*(\w*)[^\n]*\n(.*?)```", re.DOTALL)


def extract_code(completion: str) -> str:
    """The last fenced code block of the completion (a ``python`` one preferred), else all of it."""
    blocks = _FENCED.findall(completion)
    python_blocks = [code for language, code in blocks if language.lower() in ("python", "py", "python3")]
    chosen = python_blocks or [code for _, code in blocks]
    return chosen[-1] if chosen else completion


def same_output(actual: str, expected: str) -> bool:
    """Judge-style comparison: equal line by line, ignoring trailing whitespace and trailing blank lines."""
    def lines(text: str) -> list[str]:
        return [line.rstrip() for line in text.rstrip().splitlines()]

    return lines(actual) == lines(expected)


@reward("code_execution")
def code_execution(
    prompt: str, completion: str, *, completion_ids: list[int], metadata: dict, **limits
) -> float:
    """Whether the completion's code passes the prompt's tests: 1 or 0 for ``metadata["tests"]``,
    else the fraction of ``metadata["test_cases"]`` passed.

    ``tests``: Python (asserts) run after the code; 1 if the script exits cleanly.
    ``test_cases``: a list (or its JSON text, as the wire's string metadata carries it) of
    ``{"input": stdin, "output": expected stdout}``, each its own run.
    Code that crashes, loops or exceeds a limit scores 0 (the model's fault, so a real score);
    only a sandbox that cannot start makes the completion unscorable. ``limits`` are
    :class:`~rewards.sandbox.SandboxLimits` fields (``timeout_s`` per run etc.); keep the reward
    pool's ``timeout_s`` above the total run time.
    """
    sandbox = SandboxLimits(**limits)
    code = extract_code(completion)
    if "tests" in metadata:
        return float(run_python(f"{code}\n\n{metadata['tests']}\n", limits=sandbox).ok)
    cases = metadata["test_cases"]
    cases = json.loads(cases) if isinstance(cases, str) else cases
    if not isinstance(cases, list) or not cases:
        raise ValueError("metadata['test_cases'] must be a non-empty list of {input, output} cases")
    passed = sum(_passes(run_python(code, str(case["input"]), sandbox), str(case["output"]))
                 for case in cases)
    return passed / len(cases)


def _passes(result: SandboxResult, expected: str) -> bool:
    return result.ok and same_output(result.stdout, expected)

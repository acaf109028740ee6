"""The code-execution reward and its sandbox, with real subprocesses and real limits."""

import json
import os
import socket
import subprocess
import time

import pytest

from rewards import resolve
from rewards.code_execution import extract_code, same_output
from rewards.sandbox import SANDBOX_UID, SandboxLimits, run_python

LIMITS = {"timeout_s": 2.0, "cpu_s": 1, "memory_mb": 512, "max_processes": 16}
# The code under test would run for 60 s if unstopped; "stopped" means well before that. The slack
# absorbs a loaded CI machine (process start-up and teardown), it is not a performance bound.
SLACK_S = 10.0
ADD_TESTS = "assert add(2, 3) == 5\nassert add(-1, 1) == 0\n"


def score(completion: str, tests, key: str = "tests", **overrides) -> float:
    fn = resolve("code_execution")
    return fn("prompt", completion, completion_ids=[], metadata={key: tests}, **(LIMITS | overrides))


def sandbox_processes() -> int:
    """Processes of the sandbox user on this machine (ours run as it when the tests run as root)."""
    out = subprocess.run(["ps", "-o", "pid=", "-u", str(SANDBOX_UID)], capture_output=True, text=True)
    return len(out.stdout.split())


def assert_machine_fine() -> None:
    if os.geteuid() == 0:
        assert sandbox_processes() == 0
    assert score("```python\ndef add(a, b):\n    return a + b\n```", ADD_TESTS) == 1.0


def test_correct_code_scores_one_and_wrong_code_zero():
    correct = "Here you go:\n```python\ndef add(a, b):\n    return a + b\n```\nDone."
    wrong = "```python\ndef add(a, b):\n    return a - b\n```"
    broken = "```python\ndef add(a, b) return\n```"
    assert score(correct, ADD_TESTS) == 1.0
    assert score(wrong, ADD_TESTS) == 0.0
    assert score(broken, ADD_TESTS) == 0.0


def test_stdin_stdout_cases_score_the_fraction_passed():
    cases = [{"input": "1 2\n", "output": "3\n"}, {"input": "5 5", "output": "10"},
             {"input": "2 2", "output": "5"}]
    completion = "```python\na, b = map(int, input().split())\nprint(a + b)   \n```"
    assert score(completion, cases, key="test_cases") == pytest.approx(2 / 3)
    assert score(completion, json.dumps(cases), key="test_cases") == pytest.approx(2 / 3)  # wire metadata
    with pytest.raises(ValueError, match="test_cases"):
        score(completion, [], key="test_cases")
    with pytest.raises(KeyError):
        score(completion, [], key="unrelated")


def test_infinite_loop_is_stopped_by_the_cpu_limit():
    result = run_python("while True:\n    pass", limits=SandboxLimits(**LIMITS | {"timeout_s": 30.0}))
    # killed at 1 s of CPU time, long before the wall clock (unshare reports the kill as exit code 1)
    assert result.returncode != 0 and not result.timed_out and result.wall_s < 1 + SLACK_S
    assert_machine_fine()


def test_sleeping_code_is_stopped_by_the_wall_clock():
    start = time.monotonic()
    assert score("import time\ntime.sleep(60)", ADD_TESTS) == 0.0
    assert time.monotonic() - start < LIMITS["timeout_s"] + SLACK_S
    result = run_python("import time\ntime.sleep(60)", limits=SandboxLimits(**LIMITS | {"timeout_s": 0.5}))
    assert result.timed_out and result.wall_s < 0.5 + SLACK_S
    assert_machine_fine()


@pytest.mark.parametrize(
    "bomb",
    [
        "import os\nwhile True:\n    os.fork()",
        "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass",
        # children that leave the process group and sleep: only the PID namespace ends them
        "import os, time\nfor _ in range(8):\n"
        "    if os.fork() == 0:\n        os.setsid()\n        time.sleep(60)",
    ],
)
def test_fork_bomb_is_stopped_by_the_process_limit(bomb):
    start = time.monotonic()
    assert score(bomb, ADD_TESTS) == 0.0
    assert time.monotonic() - start < LIMITS["timeout_s"] + SLACK_S
    assert_machine_fine()


def test_ten_gigabyte_allocation_is_stopped_by_the_memory_limit():
    result = run_python("data = bytearray(10 * 1024**3)", limits=SandboxLimits(**LIMITS))
    assert result.returncode != 0 and not result.timed_out
    assert "MemoryError" in result.stderr
    assert score("data = bytearray(10 * 1024**3)\ndef add(a, b):\n    return a + b", ADD_TESTS) == 0.0
    assert_machine_fine()


def test_huge_output_is_cut_by_the_file_size_limit():
    result = run_python("while True:\n    print('x' * 4096)", limits=SandboxLimits(**LIMITS, max_file_mb=1))
    assert not result.ok and len(result.stdout) == SandboxLimits().max_output_chars


def test_no_network_not_even_loopback():
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        code = (
            "import socket\n"
            f"try:\n    socket.create_connection(('127.0.0.1', {port}), timeout=1)\n"
            "except OSError as error:\n    print('blocked', type(error).__name__)\n"
            "else:\n    print('connected')\n"
        )
        result = run_python(code, limits=SandboxLimits(**LIMITS))
    assert result.ok and result.stdout.startswith("blocked"), result


@pytest.mark.skipif(os.geteuid() != 0, reason="checks the privilege drop of root")
def test_code_runs_unprivileged_in_a_private_working_directory(tmp_path):
    target = tmp_path / "owned_by_root.txt"
    target.write_text("keep")
    code = f"import os\nprint(os.getuid(), os.listdir('.'))\nopen({str(target)!r}, 'w').write('gone')"
    result = run_python(code, limits=SandboxLimits(**LIMITS))
    assert result.returncode != 0 and "PermissionError" in result.stderr
    assert result.stdout.split()[0] == str(SANDBOX_UID) and "main.py" in result.stdout
    assert target.read_text() == "keep"


def test_limits_still_hold_without_namespaces():
    """The fallback for hosts without unshare: rlimits (and the user drop) only."""
    no_namespaces = LIMITS | {"namespaces": False}
    assert score("def add(a, b):\n    return a + b", ADD_TESTS, **no_namespaces) == 1.0
    assert score("while True:\n    pass", ADD_TESTS, **no_namespaces) == 0.0
    assert score("data = bytearray(10 * 1024**3)", ADD_TESTS, **no_namespaces) == 0.0
    result = run_python("import os\nprint(os.environ['https_proxy'])", limits=SandboxLimits(**no_namespaces))
    assert result.stdout.strip() == "http://127.0.0.1:9"


def test_extract_code_and_output_comparison():
    assert extract_code("a\n```py\nx = 1\n```\n```\ny = 2\n```") == "x = 1\n"
    assert extract_code("```\ny = 2\n```") == "y = 2\n"
    assert extract_code("print(3)") == "print(3)"
    assert same_output("1  \n2\n\n", "1\n2")
    assert not same_output("1\n2", "1\n3")


def test_a_multithreaded_caller_with_jax_loaded_runs_no_python_between_fork_and_exec():
    """A reward worker may have JAX (or gRPC, Ray) threads running: the sandbox starts its child with no
    preexec_fn, so no fork handler runs (JAX's warns that a forked threaded process may deadlock)."""
    import warnings

    import jax.numpy as jnp

    float(jnp.ones(4).sum())  # JAX's thread pool is up
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = run_python("import resource\nprint(resource.getrlimit(resource.RLIMIT_NPROC))",
                            limits=SandboxLimits(**LIMITS))
    assert result.ok and result.stdout.strip() == f"({LIMITS['max_processes']}, {LIMITS['max_processes']})"
    assert not [w for w in caught if "fork" in str(w.message)], [str(w.message) for w in caught]

"""End to end, the way users run it: README.md's cluster commands, run as written.

The lines of the fenced block between the `<!-- cluster-commands -->` markers are read from the
README and run in order, each in bash after the block's `source`/`export` lines, on a fresh HOME (no
~/.ray/auth_token yet) and with no Ray auth setting inherited, as a new user meets them. What is added
says only where and how small, never how to authenticate: the `ray start` line gets loopback flags
and free ports (other Rays on the machine hold the defaults), the `ray job submit` line a tiny run
(later overrides win), and the later commands find the head through RAY_ADDRESS /
RAY_API_SERVER_ADDRESS. The head is stopped through its own processes, not `ray stop` (that stops
every Ray on the machine, this session's included).

Checks: token auth is on (the dashboard says so and refuses a request without the token); the job
succeeds with every step's groups consumed once and the accounting balanced, the weight version
advancing every step, a checkpoint and an HF export; `python -m actors.fleet` talks to the cluster
(the finished run closed its fleet, so it finds none), and without the token says what to do in
one line instead of a traceback.
"""

import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request

import pytest
from ray_head_helpers import ROOT, loopback_head_flags, stop_cluster

pytestmark = pytest.mark.slow  # a Ray cluster and a submitted job

BEGIN, END = "<!-- cluster-commands", "<!-- /cluster-commands -->"
STEPS, PROMPTS, GROUP = 3, 4, 4


def readme_cluster_commands() -> list[str]:
    """The command lines of README.md's cluster block, comments removed."""
    text = (ROOT / "README.md").read_text()
    block = text[text.index(BEGIN):text.index(END)]
    body = block.split("```bash\n", 1)[1].split("```", 1)[0]
    lines = (re.sub(r"\s+#\s.*$", "", line).strip() for line in body.splitlines())
    return [line for line in lines if line and not line.startswith("#")]


def dashboard_get(dashboard: str, path: str) -> tuple[int, str]:
    """GET without any token: (status, body)."""
    try:
        with urllib.request.urlopen(dashboard + path, timeout=30) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def test_the_readme_cluster_commands_run_as_written_with_token_auth(tmp_path):
    commands = readme_cluster_commands()
    setup = [c for c in commands if c.startswith(("source ", "export "))]
    assert "export RAY_AUTH_MODE=token" in setup, commands
    home = tmp_path / "home"
    home.mkdir()
    run_dir, data_dir = tmp_path / "rl", tmp_path / "data"
    tiny_run = [f"run_dir={run_dir}", f"data.dir={data_dir}", f"train.steps={STEPS}",
                f"train.prompts_per_step={PROMPTS}", f"rollout.group_size={GROUP}", "rollout.prompts_per_batch=4",
                "rollout.queue_capacity=8", "optim.warmup_steps=0", "train.eval_every=0", "train.checkpoint_every=1",
                "train.stop_at=null", "train.stop_at_plateau=null",  # the demo's early end needs evaluations
                "data.eval_examples=16", "algo.dynamic_sampling=off",  # from scratch no group has signal
                "train.compile_ahead=first"]
    temp_dir = tempfile.mkdtemp(prefix="tdm-", dir="/tmp")  # short: unix socket paths are limited
    flags, dashboard, gcs = loopback_head_flags(temp_dir)
    fresh = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH") and k != "RAY_ADDRESS"}
    fresh |= {"HOME": str(home), "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "VLLM_CPU_KVCACHE_SPACE": "1",
              "JAX_PLATFORMS": "cpu"}
    joined = {**fresh, "RAY_ADDRESS": gcs, "RAY_API_SERVER_ADDRESS": dashboard}

    def run(command: str, env: dict[str, str], timeout: float = 180) -> subprocess.CompletedProcess:
        script = "\n".join(["set -e", *setup, command])
        return subprocess.run(["bash", "-c", script], env=env, cwd=ROOT, capture_output=True, text=True,
                              timeout=timeout)

    ran = []
    try:
        for command in (c for c in commands if c not in setup):
            if command.startswith("ray get-auth-token --generate"):
                done = run(command, fresh)
                assert done.returncode == 0, done.stderr
                token = (home / ".ray" / "auth_token").read_text().strip()
                assert len(token) >= 32 and token not in done.stdout + done.stderr
                ran.append("token")
            elif command.startswith("ray start --head"):
                done = run(f"{command} {shlex.join(flags)}", fresh)
                assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
                assert json.loads(dashboard_get(dashboard, "/api/authentication_mode")[1])["authentication_mode"] \
                    == "token"
                assert dashboard_get(dashboard, "/api/jobs/")[0] == 401  # no token, no jobs
                ran.append("start")
            elif command.startswith("ray job submit"):
                done = run(f"{command} {shlex.join(tiny_run)}", joined, timeout=900)
                assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
                assert "succeeded" in done.stdout.lower()
                ran.append("submit")
            elif command.startswith("python -m actors.fleet --close"):
                done = run(command, joined, timeout=120)
                assert done.returncode == 0, done.stderr[-3000:]
                assert "no fleet named" in done.stdout  # connected; the finished run had closed it
                ran.append("close")
            elif command.startswith("python -m actors.fleet "):
                done = run(command, joined, timeout=120)
                assert done.returncode == 1 and "error: no tandem fleet named" in done.stderr, done.stderr[-3000:]
                assert "Traceback" not in done.stderr
                ran.append("scale")
            else:
                pytest.fail(f"README's cluster block has a command this test does not know: {command!r}")
        assert ran == ["token", "start", "submit", "scale", "close"]

        # The same client without the token: one line naming the fix, no traceback.
        empty_home = tmp_path / "no-token-home"
        empty_home.mkdir()
        refused = subprocess.run([sys.executable, "-m", "actors.fleet", "--close"], cwd=ROOT, capture_output=True,
                                 text=True, timeout=120, env={**joined, "HOME": str(empty_home),
                                                              "RAY_AUTH_MODE": "token"})
        assert refused.returncode == 1 and "Traceback" not in refused.stderr, refused.stderr[-3000:]
        assert "error: cannot join the Ray cluster" in refused.stderr and "RAY_AUTH_TOKEN" in refused.stderr
    finally:
        stop_cluster(temp_dir, gcs)

    summary = json.loads((run_dir / "summary.json").read_text())
    accounting = summary["accounting"]
    assert summary["accounting_violations"] == []
    assert summary["steps"] == STEPS and summary["weight_version"] == STEPS
    assert accounting["groups_consumed"] == STEPS * PROMPTS
    assert accounting["prompts_retired"] >= STEPS * PROMPTS
    assert accounting["groups_invalid"] == 0
    assert set(summary["eval"]) >= {"pass@1_greedy", "pass@8"}
    assert (run_dir / "checkpoints" / str(STEPS)).is_dir()
    assert (run_dir / "hf_final" / "config.json").exists()
    assert list((run_dir / "hf_final").glob("*.safetensors"))
    assert (run_dir / "tb" / "metrics.jsonl").read_text().count("\n") == STEPS

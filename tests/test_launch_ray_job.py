"""End to end, the way users run it: a real Ray head on loopback, `ray job submit ... launch/rl.py`.

Checks that the job succeeds, groups were consumed exactly once and balanced, the weight version
advanced every step, and a checkpoint and an HF export exist. Ray is started and stopped here.
"""

import contextlib
import json
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
STEPS, PROMPTS, GROUP = 3, 4, 4


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop_cluster(temp_dir: str, gcs_port: int) -> None:
    """Stop only this test's Ray cluster (`ray stop` would kill every Ray on the machine, including
    the test session's shared one): its processes name its temp dir or GCS address; take their
    process trees too."""
    own = {os.getpid(), *(p.pid for p in psutil.Process().parents())}

    def ours(p: psutil.Process) -> bool:
        command = " ".join(p.info["cmdline"] or [])
        return p.pid not in own and (temp_dir in command or f"127.0.0.1:{gcs_port}" in command)

    roots = [p for p in psutil.process_iter(["cmdline"]) if ours(p)]
    procs = {q.pid: q for p in roots for q in [p, *p.children(recursive=True)] if q.pid not in own}
    for p in procs.values():
        with contextlib.suppress(psutil.NoSuchProcess):
            p.terminate()
    _, alive = psutil.wait_procs(list(procs.values()), timeout=15)
    for p in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()


@pytest.fixture
def ray_head():
    """A Ray head on 127.0.0.1 whose job drivers use this interpreter (its bin dir first on PATH)."""
    temp_dir = tempfile.mkdtemp(prefix="tdm-", dir="/tmp")  # short: unix socket paths are limited
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}", "RAY_AUTH_MODE": "disabled",
           "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "VLLM_CPU_KVCACHE_SPACE": "1", "JAX_PLATFORMS": "cpu"}
    env.pop("RAY_ADDRESS", None)
    dashboard, gcs = free_port(), free_port()
    # Every fixed default port is replaced: the test session's own local Ray (ray_session) already
    # holds the defaults (e.g. the dashboard agent's 52365), and a second cluster must not collide.
    ports = [f"--{flag}={free_port()}" for flag in (
        "dashboard-agent-listen-port", "dashboard-agent-grpc-port", "runtime-env-agent-port",
        "ray-client-server-port", "metrics-export-port", "node-manager-port", "object-manager-port")]
    subprocess.run(
        [str(BIN / "ray"), "start", "--head", "--node-ip-address=127.0.0.1", f"--port={gcs}",
         "--num-cpus=4", '--resources={"rollout": 2, "reward": 2}', "--dashboard-host=127.0.0.1",
         f"--dashboard-port={dashboard}", "--disable-usage-stats", f"--temp-dir={temp_dir}", *ports],
        env=env, check=True, capture_output=True, timeout=180,
    )
    try:
        yield env, f"http://127.0.0.1:{dashboard}"
    finally:
        stop_cluster(temp_dir, gcs)


def test_rl_job_submitted_to_a_running_cluster_trains_and_exports(ray_head, tmp_path):
    env, address = ray_head
    run_dir = tmp_path / "rl"
    job = subprocess.run(
        [str(BIN / "ray"), "job", "submit", f"--address={address}", "--working-dir", str(ROOT), "--",
         "python", "launch/rl.py", "launch/configs/demo_rl.yaml", f"run_dir={run_dir}",
         f"data.dir={tmp_path / 'data'}", f"train.steps={STEPS}", f"train.prompts_per_step={PROMPTS}",
         f"rollout.group_size={GROUP}", "rollout.prompts_per_batch=4", "rollout.queue_capacity=8",
         "optim.warmup_steps=0", "train.eval_every=0", "train.checkpoint_every=1", "data.eval_examples=16"],
        env=env, capture_output=True, text=True, timeout=900, cwd=ROOT,
    )
    assert job.returncode == 0, job.stdout[-4000:] + job.stderr[-4000:]
    assert "succeeded" in job.stdout.lower()

    summary = json.loads((run_dir / "summary.json").read_text())
    accounting = summary["accounting"]
    assert summary["steps"] == STEPS and summary["weight_version"] == STEPS
    assert accounting["groups_consumed"] == STEPS * PROMPTS
    assert accounting["prompts_retired"] >= STEPS * PROMPTS
    assert accounting["groups_invalid"] == 0
    assert set(summary["eval"]) >= {"pass@1_greedy", "pass@8"}
    assert (run_dir / "checkpoints" / str(STEPS)).is_dir()
    assert (run_dir / "hf_final" / "config.json").exists()
    assert list((run_dir / "hf_final").glob("*.safetensors"))
    assert (run_dir / "tb" / "metrics.jsonl").read_text().count("\n") == STEPS

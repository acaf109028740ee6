"""A real Ray head on loopback: the test session's shared one (conftest's ray_session joins it) and one
more for the tests that run tandem the way users do (`ray job submit`), and a way to stop only one
cluster (`ray stop` would kill every Ray on the machine, including the test session's shared one).

The heads run with Ray's token auth on, as users' do: `ray_head_cluster` hands every process its own
token in RAY_AUTH_TOKEN (nothing written to ~/.ray); test_launch_ray_job.py starts its head with the
README's own commands instead, on a fresh HOME."""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


@dataclass(frozen=True)
class RayHead:
    env: dict[str, str]  # for `ray` CLI calls and drivers: this interpreter first on PATH
    dashboard: str  # http://127.0.0.1:PORT (job submission, state API)
    gcs: str  # 127.0.0.1:PORT (ray.init / ray_address)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop_cluster(temp_dir: str, gcs: str) -> None:
    """Stop only the cluster with this temp dir and GCS address (127.0.0.1:PORT): its processes name
    one or the other; take their process trees too. Then remove the temp dir (its sessions' logs and
    sockets), which Ray leaves behind."""
    own = {os.getpid(), *(p.pid for p in psutil.Process().parents())}
    gcs_named = re.compile(rf"{re.escape(gcs)}(?!\d)")  # not another cluster's 127.0.0.1:41234 for :4123

    def ours(p: psutil.Process) -> bool:
        command = " ".join(p.info["cmdline"] or [])
        return p.pid not in own and (temp_dir in command or gcs_named.search(command) is not None)

    roots = [p for p in psutil.process_iter(["cmdline"]) if ours(p)]
    procs = {q.pid: q for p in roots for q in [p, *p.children(recursive=True)] if q.pid not in own}
    for p in procs.values():
        with contextlib.suppress(psutil.NoSuchProcess):
            p.terminate()
    _, alive = psutil.wait_procs(list(procs.values()), timeout=15)
    for p in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()
    shutil.rmtree(temp_dir, ignore_errors=True)


def loopback_head_flags(temp_dir: str) -> tuple[list[str], str, str]:
    """`ray start --head` flags for a head on 127.0.0.1 that takes free ports, not Ray's defaults: the
    test session's own local Ray (ray_session) or another session's already holds the defaults (e.g.
    the dashboard agent's 52365), and a second cluster must not collide. Returns the flags, the
    dashboard URL (job submission, state API) and the GCS address (ray.init)."""
    dashboard, gcs = free_port(), free_port()
    ports = [f"--{flag}={free_port()}" for flag in (
        "dashboard-agent-listen-port", "dashboard-agent-grpc-port", "runtime-env-agent-port",
        "ray-client-server-port", "metrics-export-port", "node-manager-port", "object-manager-port")]
    flags = ["--node-ip-address=127.0.0.1", f"--port={gcs}", "--dashboard-host=127.0.0.1",
             f"--dashboard-port={dashboard}", "--disable-usage-stats", f"--temp-dir={temp_dir}", *ports]
    return flags, f"http://127.0.0.1:{dashboard}", f"127.0.0.1:{gcs}"


@contextlib.contextmanager
def ray_head_cluster(*, resources: dict[str, int] | None = None, job_server: bool = True,
                     token: str | None = None) -> Iterator[RayHead]:
    """A Ray head on 127.0.0.1 with tandem's resources (`resources`, default 2 rollout and 2 reward slots)
    and token auth on (`token`, default a new one), whose workers and job drivers use this interpreter and
    can import the repo. `job_server=False`: no dashboard (job submission) and no log monitor, for a
    cluster only joined."""
    temp_dir = tempfile.mkdtemp(prefix="tdm-", dir="/tmp")  # short: unix socket paths are limited
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}", "RAY_AUTH_MODE": "token",
           "RAY_AUTH_TOKEN": token or secrets.token_hex(32), "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
           "VLLM_CPU_KVCACHE_SPACE": "1", "JAX_PLATFORMS": "cpu"}
    env.pop("RAY_ADDRESS", None)
    flags, dashboard, gcs = loopback_head_flags(temp_dir)
    if not job_server:
        flags += ["--include-dashboard=false", "--include-log-monitor=false"]
    resources = json.dumps(resources or {"rollout": 2, "reward": 2})
    try:
        subprocess.run([str(BIN / "ray"), "start", "--head", "--num-cpus=4", f"--resources={resources}", *flags],
                       env=env, cwd=ROOT, check=True, capture_output=True, timeout=180)
        yield RayHead(env, dashboard, gcs)
    finally:
        stop_cluster(temp_dir, gcs)


def submit_command(head: RayHead, *entrypoint: str, no_wait: bool = False) -> list[str]:
    """`ray job submit` of ``entrypoint`` with the repo as the job's working dir."""
    return [str(BIN / "ray"), "job", "submit", f"--address={head.dashboard}", "--working-dir", str(ROOT),
            *(["--no-wait"] if no_wait else []), "--", *entrypoint]

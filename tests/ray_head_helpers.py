"""A real Ray head on loopback for the tests that run tandem the way users do (`ray job submit`), and
a way to stop only that cluster (`ray stop` would kill every Ray on the machine, including the test
session's shared one)."""

from __future__ import annotations

import contextlib
import os
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


def stop_cluster(temp_dir: str, gcs_port: int) -> None:
    """Stop only the cluster with this temp dir and GCS port: its processes name one or the other;
    take their process trees too."""
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


@contextlib.contextmanager
def ray_head_cluster() -> Iterator[RayHead]:
    """A Ray head on 127.0.0.1 with tandem's resources, whose workers and job drivers use this
    interpreter and can import the repo."""
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
        yield RayHead(env, f"http://127.0.0.1:{dashboard}", f"127.0.0.1:{gcs}")
    finally:
        stop_cluster(temp_dir, gcs)


def submit_command(head: RayHead, *entrypoint: str, no_wait: bool = False) -> list[str]:
    """`ray job submit` of ``entrypoint`` with the repo as the job's working dir."""
    return [str(BIN / "ray"), "job", "submit", f"--address={head.dashboard}", "--working-dir", str(ROOT),
            *(["--no-wait"] if no_wait else []), "--", *entrypoint]

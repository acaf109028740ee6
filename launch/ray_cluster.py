"""Connect to the Ray cluster a job runs in, or start a local one for `python launch/<entry>.py`.

Under `ray job submit --working-dir . -- python launch/rl.py ...` the driver already has
RAY_ADDRESS and the job's working directory on every worker's path. Run directly, the entrypoint
starts a local Ray whose workers get the repo root on PYTHONPATH and the resources tandem's
actors ask for (`rollout`, `reward`). On a real cluster, start nodes with those resources, e.g.
`ray start --head --resources='{"rollout": 8, "reward": 4}'`, and Ray's token auth on, as README.md's
cluster commands do: a job's driver inherits RAY_AUTH_MODE=token and the token from its node; a
process joining from outside needs both itself, and is told so when they are missing.
"""

from __future__ import annotations

import os
from pathlib import Path

import ray

from actors.config import ENGINE_ENV
from actors.fleet import ClusterUnreachable, join_cluster
from launch.config import ConfigError

REPO_ROOT = Path(__file__).resolve().parents[1]



def connect(address: str | None = None, *, rollout_slots: int = 4, reward_slots: int = 4,
            num_cpus: int | None = None) -> bool:
    """Initialise Ray; returns True when this call started a local cluster (the caller shuts it down)."""
    if ray.is_initialized():
        return False
    env = dict(ENGINE_ENV)
    for name in ("VLLM_CPU_KVCACHE_SPACE", "JAX_PLATFORMS", "TANDEM_AUTH_TOKEN"):
        if name in os.environ:
            env[name] = os.environ[name]
    address = address or os.environ.get("RAY_ADDRESS")
    if address:
        try:
            join_cluster(address, runtime_env={"env_vars": env}, log_to_driver=True)
        except ClusterUnreachable as error:  # exit code 2 and one line (main_for), not a traceback
            raise ConfigError(f"ray_address / RAY_ADDRESS: {error}") from None
        return False
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    ray.init(
        num_cpus=num_cpus or max(4, os.cpu_count() or 1),
        resources={"rollout": rollout_slots, "reward": reward_slots},
        include_dashboard=False,
        runtime_env={"env_vars": env},
    )
    return True

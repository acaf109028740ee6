"""Session-wide test set-up: simulated 8-device CPU mesh for JAX, small vLLM KV cache, one Ray."""

import os
import sys
from pathlib import Path

# Must happen before anything imports jax or vllm.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import pytest  # noqa: E402


@pytest.fixture(scope="session")
def ray_session():
    """One local Ray for the whole test session (starting Ray costs ~10 s).

    Tests share it; each test cleans up the actors it created.
    """
    import ray

    if not ray.is_initialized():
        ray.init(
            num_cpus=4,
            resources={"rollout": 4, "reward": 4},
            include_dashboard=False,
            log_to_driver=False,
            runtime_env={"env_vars": {"PYTHONPATH": str(ROOT), "VLLM_CPU_KVCACHE_SPACE": "1",
                                      "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "JAX_PLATFORMS": "cpu"}},
        )
    yield ray
    ray.shutdown()


@pytest.fixture
def ray_head():
    """A second, real Ray cluster (`ray start --head` on loopback) for tests that submit jobs to it."""
    from ray_head_helpers import ray_head_cluster

    with ray_head_cluster() as head:
        yield head

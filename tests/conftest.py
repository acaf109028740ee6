"""Session-wide test set-up: simulated 8-device CPU mesh for JAX, a fresh JAX compilation cache, small
vLLM KV cache, one Ray."""

import atexit
import os
import shutil
import sys
import tempfile
from pathlib import Path

# Must happen before anything imports jax or vllm.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    # JAX's persistent compilation cache, fresh for each session (as on CI's fresh machine): the
    # processes tests start (relaunched learners, drivers, multi-host pairs) and later tests load
    # the steps earlier ones compiled instead of compiling them again
    _cache_dir = tempfile.mkdtemp(prefix="tandem-jax-cache-")
    os.environ["JAX_COMPILATION_CACHE_DIR"] = _cache_dir
    atexit.register(shutil.rmtree, _cache_dir, ignore_errors=True)

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


# `make test` runs the suite on two pytest-xdist workers: a serial run keeps ~1.1 of the machine's 2
# cores busy (waits on subprocesses, engines, Ray and timeouts), so a second worker fills the other.
# Each module stays on one worker (its module-scoped fixtures are built once), and the modules that each
# hold many GiB (a 151k-vocabulary model, the demo's checkpoints and engines, pairs of learner
# processes) share one worker, one after another: with modules spread freely, Ray's memory monitor
# killed the real-shape test's engine (22.5 of 23.5 GiB in use). That group goes first, in this order:
# it is about half of the suite's time.
MEMORY_HEAVY = ("test_demo_rl_learns", "test_real_shape", "test_multihost", "test_bench_smoke",
                "test_learner_long_sequences")


def _rank(module: str) -> int:
    return MEMORY_HEAVY.index(module) if module in MEMORY_HEAVY else len(MEMORY_HEAVY)


def pytest_collection_modifyitems(config, items):
    # stable: modules keep their order; `--no-loadscope-reorder` keeps this order of scopes
    items.sort(key=lambda item: _rank(item.path.stem))


def pytest_xdist_make_scheduler(config, log):
    """Scope = the module, or one scope for all memory-heavy modules. (xdist's own `xdist_group` marks
    do nothing under pytest 9: xdist renames items through an attribute pytest no longer reads.)"""
    from xdist.scheduler import LoadScopeScheduling

    class ModuleScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return "memory-heavy" if Path(module).stem in MEMORY_HEAVY else module

    return ModuleScheduling(config, log)

"""Session-wide test set-up: simulated 8-device CPU mesh for JAX, a fresh JAX compilation cache, small
vLLM KV cache, one Ray."""

import atexit
import logging
import os
import secrets
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
if "RAY_AUTH_TOKEN" not in os.environ:
    # the session's Ray (ray_session) runs with token auth, as users' clusters do; Ray reads the mode when
    # it is imported, so it is set before anything imports ray, and the processes the tests start inherit it
    os.environ["RAY_AUTH_MODE"] = "token"
    os.environ["RAY_AUTH_TOKEN"] = secrets.token_hex(32)
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# torch (the vLLM engines and transformers models that tests run in this process and in the processes it
# starts) and numpy's BLAS on one OpenMP thread: the suite keeps both cores busy, and OpenMP's threads spin
# while they wait for a core. Measured here, an engine generating the same batches beside two busy
# processes: 6.0 s wall and 5.8 s CPU with 2 threads, 2.0 s and 1.3 s with one (alone 1.1 s and 2.1 s,
# against 1.2 s and 1.2 s). Ray already gives its actors (num_cpus=1) one thread.
os.environ.setdefault("OMP_NUM_THREADS", "1")
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    # JAX's persistent compilation cache, fresh for each session (as on CI's fresh machine): the
    # processes tests start (relaunched learners, drivers, multi-host pairs) and later tests load
    # the steps earlier ones compiled instead of compiling them again
    _cache_dir = tempfile.mkdtemp(prefix="tandem-jax-cache-")
    os.environ["JAX_COMPILATION_CACHE_DIR"] = _cache_dir
    atexit.register(shutil.rmtree, _cache_dir, ignore_errors=True)
if "TRACKIO_DIR" not in os.environ:
    # trackio's local store (tests/test_tracking*.py), fresh for each session and not the user's: trackio reads
    # the variable once, when it is imported
    _trackio_dir = tempfile.mkdtemp(prefix="tandem-trackio-")
    os.environ["TRACKIO_DIR"] = _trackio_dir
    atexit.register(shutil.rmtree, _trackio_dir, ignore_errors=True)
# Every compiled program goes into that cache, not only those that took over a second to compile (JAX's
# default): the suite compiles the same tiny steps in many tests, processes and Ray workers, each taking
# 0.1-1 s on this machine. The learner and model modules' fast tests went from 598 s to 466 s with it.
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import pytest  # noqa: E402


@pytest.fixture(scope="session")
def ray_session():
    """One Ray for the whole test session (starting Ray costs ~10 s): a head started by `ray start`, which
    this process joins. Tests share it; each test cleans up the actors it created.

    Not `ray.init()`'s own local cluster: that starts the GCS and raylet from this process with
    `subprocess.Popen(preexec_fn=...)`, which runs the process's fork handlers, and here JAX's backends
    (threads) may already run: JAX warns that the fork can deadlock. `ray start` is a fresh process
    without JAX, and joining a cluster starts no process.
    """
    import ray
    from ray_head_helpers import ray_head_cluster

    if ray.is_initialized():
        yield ray
        return
    with ray_head_cluster(resources={"rollout": 4, "reward": 4}, job_server=False,
                          token=os.environ["RAY_AUTH_TOKEN"]) as head:
        ray.init(address=head.gcs, log_to_driver=False,
                 runtime_env={"env_vars": {"PYTHONPATH": str(ROOT), "VLLM_CPU_KVCACHE_SPACE": "1",
                                           "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "JAX_PLATFORMS": "cpu"}})
        yield ray
        ray.shutdown()


@pytest.fixture(scope="session")
def weight_dirs(tmp_path_factory) -> dict[str, Path]:
    """The actor tests' tiny Qwen2 checkpoint ("base", random weights from models.tiny) and three other
    versions of it, "sharp_a", "sharp_b", "sharp_c" (random weights of seeds 1, 2, 3, sharper than the base's:
    greedy tokens free of near-ties), as HF dirs; built once per session and only read."""
    from actors_helpers import load_tensors, make_base_model, random_weights, write_weights_dir

    root = tmp_path_factory.mktemp("weights")
    base = make_base_model(root / "base")
    tensors = load_tensors(base)
    return {"base": base, **{name: write_weights_dir(base, root / name, random_weights(tensors, seed=seed))
                             for seed, name in enumerate(("sharp_a", "sharp_b", "sharp_c"), start=1)}}


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory) -> Path:
    """The learner tests' tiny HF model dir (learner_train_helpers.TINY: shards over fsdp=8 and
    fsdp=4 × tp=2), built once per module."""
    from learner_train_helpers import tiny_model_dir

    return tiny_model_dir(tmp_path_factory.mktemp("tiny"))


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
# processes) share one worker, one after another, first, in this order: about half of the suite's time.
# The two largest (EXCLUSIVE: 11-17 GiB each) also hold the machine lock exclusively, and every other
# slow module (engines, Ray actors, long training: 2-5 GiB with their Ray workers) holds it shared, so
# neither runs beside them: with only the grouping, Ray's memory monitor killed the real-shape test's
# workers while the other worker ran a LoRA RL test (23.2 of 23.5 GiB in use). The other worker starts
# with the fast modules, which need no lock, so it rarely waits.
# Slow for time alone (tiny models trained or compiled in this process or one child, no engine, no Ray):
# they take no lock and are ordered with the modules without a slow test, so the other worker has work
# while the EXCLUSIVE modules run, instead of waiting on the lock once its own run out (on a clean clone
# the environment test's module setup, where that wait is counted, took 324 s, and 257 s with this; the
# module alone ~130 s).
LOCK_FREE_SLOW = ("test_learner_checkpoint", "test_learner_logprobs", "test_learner_lora",
                  "test_learner_mixed_precision", "test_models_lora", "test_version_sets")
MEMORY_HEAVY = ("test_real_shape", "test_multihost", "test_learner_long_sequences", "test_bench_smoke",
                "test_demo_rl_learns")
EXCLUSIVE = ("test_real_shape", "test_multihost")


def _is_slow(item) -> bool:
    return item.get_closest_marker("slow") is not None


def _holds_the_lock(item) -> bool:
    return _is_slow(item) and item.path.stem not in LOCK_FREE_SLOW


def pytest_collection_modifyitems(config, items):
    """The heavy group first, then the modules that take no lock, then the rest; stable within each
    (`--no-loadscope-reorder` keeps this order of scopes)."""
    locking_modules = {item.path for item in items if _holds_the_lock(item)}

    def rank(item) -> tuple[int, int]:
        module = item.path.stem
        if module in MEMORY_HEAVY:
            return MEMORY_HEAVY.index(module), 0
        return len(MEMORY_HEAVY), int(item.path in locking_modules)

    items.sort(key=rank)


def pytest_xdist_make_scheduler(config, log):
    """Scope = the module, or one scope for all memory-heavy modules. (xdist's own `xdist_group` marks
    do nothing under pytest 9: xdist renames items through an attribute pytest no longer reads.)"""
    from xdist.scheduler import LoadScopeScheduling

    class ModuleScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return "memory-heavy" if Path(module).stem in MEMORY_HEAVY else module

    return ModuleScheduling(config, log)


@pytest.fixture(scope="module", autouse=True)
def machine_memory_lock(request, testrun_uid, worker_id):
    """Under xdist: an EXCLUSIVE module holds the run's lock file exclusively, any other module with a
    slow test (but those in LOCK_FREE_SLOW) holds it shared (flock: released if the worker dies). A serial
    run takes no lock."""
    module = request.module.__name__.rsplit(".", 1)[-1]
    exclusive = module in EXCLUSIVE
    shared = any(_holds_the_lock(item) for item in request.session.items if item.path == request.path)
    if worker_id == "master" or not (exclusive or shared):
        yield
        return
    import fcntl

    with open(Path(tempfile.gettempdir()) / f"tandem-tests-{testrun_uid}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        yield


def _rss_gib() -> float:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**30


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_teardown(item, nextitem):
    """Before a test's fixtures are torn down: stop writing the run_dir/debug.log of a stage it ran
    (launch.run.prepare adds the handler to the root logger). A passed test's tmp_path is removed at its
    end (tmp_path_retention_policy), and a later record, once anything in this process had closed the
    handler (logging.config.dictConfig closes every handler), would reopen that file and raise
    FileNotFoundError in whatever code logged it (CI at b36cd26: 6 tests of the other modules failed)."""
    if any(getattr(handler, "tandem_debug_log", False) for handler in logging.getLogger().handlers):
        from launch.run import close_debug_log

        close_debug_log()


@pytest.fixture(scope="module", autouse=True)
def release_memory_after_heavy_modules(request):
    """After a memory-heavy module: drop JAX's caches (compiled steps hold their constants), collect, and
    hand glibc's free heap back to the OS, so the worker's next modules do not run on top of it."""
    yield
    if request.module.__name__.rsplit(".", 1)[-1] not in MEMORY_HEAVY:
        return
    import ctypes
    import gc

    import jax

    before = _rss_gib()
    jax.clear_caches()
    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    sys.stderr.write(f"[memory] {request.module.__name__}: worker RSS {before:.1f} -> {_rss_gib():.1f} GiB\n")

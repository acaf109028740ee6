"""The GPU install's JAX / flax / tunix set runs the learner (issue 38): the versions constraints-gpu.txt pins
for jax, jaxlib, flax and google-tunix (Python 3.12; `make ACCEL=gpu env` installs their CUDA 13 build),
installed from their CPU wheels in a throwaway virtualenv, import the learner and take an RL and an SFT
step (tests/version_set_worker.py). The project's own venv covers the CPU set (JAX 0.10.2, flax 0.12.8).

The virtualenv is cached under ~/.cache/tandem/ by the pinned versions (first run: ~2 min of downloads
and installs; then ~40 s). Skipped, saying why, when no Python 3.12 is found or the package index
cannot be reached.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CACHE = Path.home() / ".cache" / "tandem"
pytestmark = pytest.mark.slow  # a virtualenv of another JAX

# The learner's imports beyond the JAX stack (and pytest-free): pinned where constraints-gpu.txt pins them.
LEARNER_PACKAGES = ("jax", "jaxlib", "flax", "google-tunix", "optax", "orbax-checkpoint", "transformers",
                    "tokenizers", "safetensors", "numpy", "pydantic", "datasets", "tensorboardX", "grpcio",
                    "protobuf", "blake3", "xxhash", "pyyaml", "jinja2")


def pinned(packages: tuple[str, ...]) -> list[str]:
    """name==version from constraints-gpu.txt for each of `packages` (names compared case-insensitively)."""
    pins = {}
    for line in (ROOT / "constraints-gpu.txt").read_text().splitlines():
        if "==" in line and not line.startswith("#"):
            name, version = line.split("==")
            pins[name.lower().replace("_", "-")] = f"{name}=={version}"
    return [pins.get(p.lower(), p) for p in packages]


def python312() -> str | None:
    """A Python 3.12 that runs: on the PATH, or one pyenv installed (its shim fails unless selected)."""
    candidates = [shutil.which("python3.12"), *sorted(map(str, Path.home().glob(".pyenv/versions/3.12*/bin/python")))]
    for python in filter(None, candidates):
        if subprocess.run([python, "-c", "import venv"], capture_output=True).returncode == 0:
            return python
    return None


@pytest.fixture(scope="module")
def gpu_set_python() -> Path:
    python = python312()
    if python is None:
        pytest.skip("no Python 3.12 (the GPU set's JAX needs it): install python3.12 to run this test")
    requirements = pinned(LEARNER_PACKAGES)
    venv = CACHE / ("venv-gpu-set-" + hashlib.sha256(" ".join(requirements).encode()).hexdigest()[:12])
    ready = venv / ".ready"
    if not ready.exists():
        shutil.rmtree(venv, ignore_errors=True)
        subprocess.run([python, "-m", "venv", str(venv)], check=True)
        install = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", *requirements],
                                 capture_output=True, text=True)
        if install.returncode != 0:
            unreachable = ("Could not fetch URL", "NewConnectionError", "Temporary failure in name resolution",
                           "No matching distribution")
            if any(s in install.stderr for s in unreachable):
                pytest.skip(f"the package index is unreachable: {install.stderr.strip().splitlines()[-1]}")
            raise AssertionError(install.stderr[-3000:])
        ready.write_text(" ".join(requirements))
    return venv / "bin" / "python"


def test_the_gpu_sets_jax_and_flax_run_the_learners_steps(gpu_set_python, tmp_path):
    run = subprocess.run([str(gpu_set_python), str(ROOT / "tests" / "version_set_worker.py"), str(tmp_path)],
                         capture_output=True, text=True, timeout=600,
                         env={"PATH": "/usr/bin:/bin", "HOME": str(Path.home()), "JAX_PLATFORMS": "cpu"})
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads(run.stdout.strip().splitlines()[-1])
    expected = {p.split("==")[0].lower(): p.split("==")[1] for p in pinned(("jax", "jaxlib", "flax", "google-tunix"))}
    assert {k.lower(): v for k, v in report["versions"].items() if k.lower() in expected} == expected
    assert report["python"].startswith("3.12")
    for key in ("rl_loss", "sft_loss"):
        assert report[key] == report[key] and abs(report[key]) < 100, report  # finite
    assert report["rl_update_norm"] > 0 and report["sft_update_norm"] > 0
    assert sys.version_info[:2] == (3, 11)  # the suite itself runs on the CPU set's Python

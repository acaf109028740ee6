"""Each role package imports only its own heavy dependencies (shared/README.md, "Layering").

Every module of a package is imported in a fresh interpreter in which the forbidden modules
cannot be imported at all (as if they were not installed), then `sys.modules` is checked. So
an optional `try: import torch` in a third-party library (tensorboardX does this) is fine, but
any real dependency of ours on a forbidden module fails. A fresh process is needed because the
test session itself has jax (and maybe vllm) loaded already.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

PROBE = r"""
import importlib, json, pkgutil, sys
for name in json.loads(sys.argv[2]):
    sys.modules[name] = None  # Python's marker for "cannot be imported"; find_spec returns None
pkg = importlib.import_module(sys.argv[1])
for info in pkgutil.walk_packages(pkg.__path__, prefix=pkg.__name__ + "."):
    importlib.import_module(info.name)
tops = sorted({name.split(".")[0] for name, module in sys.modules.items() if module is not None})
print(json.dumps(tops))
"""

# package -> top-level modules it must never load, even indirectly.
FORBIDDEN = {
    "rewards": {"vllm", "jax", "torch", "flax", "learner", "actors", "models", "launch"},
    "learner": {"torch", "vllm", "actors", "launch"},
    "actors": {"jax", "flax", "learner", "launch"},
    "models": {"vllm", "learner", "actors", "launch", "rewards"},
    "tandem_wire": {"vllm", "jax", "torch", "learner", "actors", "models", "rewards"},
}


def loaded_top_level_modules(package: str) -> set[str]:
    out = subprocess.run(
        [sys.executable, "-c", PROBE, package, json.dumps(sorted(FORBIDDEN[package]))],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
        env={"PATH": "/usr/bin:/bin", "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(ROOT)},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return set(json.loads(out.stdout.strip().splitlines()[-1]))


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_role_package_does_not_load_other_roles_heavy_dependencies(package):
    loaded = loaded_top_level_modules(package)
    assert package in loaded
    leaked = loaded & FORBIDDEN[package]
    assert not leaked, f"importing every module of {package} loaded {sorted(leaked)}"

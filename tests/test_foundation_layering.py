"""Each role package imports only its own heavy dependencies (README.md, "Layout and layering").

Every module of a package is imported in a fresh interpreter in which the forbidden modules
cannot be imported at all (as if they were not installed), then `sys.modules` is checked. So
an optional `try: import torch` in a third-party library (tensorboardX does this) is fine, but
any real dependency of ours on a forbidden module fails. A fresh process is needed because the
test session itself has jax (and maybe vllm) loaded already.
"""

import ast
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
    # The service answers actors; importing it must not pull in JAX.
    "learner.service": {"jax", "flax", "optax", "orbax", "torch", "vllm", "actors", "launch"},
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
    assert package.split(".")[0] in loaded
    leaked = loaded & FORBIDDEN[package]
    assert not leaked, f"importing every module of {package} loaded {sorted(leaked)}"


# Rooms inside learner/ (learner/README.md): the algorithm, the service and the weight path are
# independent of one another except that the service hands out weights; the loops at the top
# (rl_loop, supervised_loop, checkpoint) tie them together and nothing below imports them.
LOOPS = {"learner.rl_loop", "learner.supervised_loop", "learner.checkpoint"}
ROOM_FORBIDDEN = {
    "learner.algo": {"learner.service", "learner.weights", *LOOPS},
    "learner.service": {"learner.algo", *LOOPS},
    "learner.weights": {"learner.algo", "learner.service", *LOOPS},
}


def imported_learner_modules(room: str) -> set[str]:
    """Every `learner.*` module named by an import statement in the room's files."""
    names: set[str] = set()
    for path in (ROOT / room.replace(".", "/")).rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                names |= {node.module, *(f"{node.module}.{alias.name}" for alias in node.names)}
            elif isinstance(node, ast.Import):
                names |= {alias.name for alias in node.names}
    return {name for name in names if name.startswith("learner.")}


@pytest.mark.parametrize("room", sorted(ROOM_FORBIDDEN))
def test_learner_room_imports_only_the_rooms_below_it(room):
    crossing = {name for name in imported_learner_modules(room)
                if any(name == bad or name.startswith(bad + ".") for bad in ROOM_FORBIDDEN[room])}
    assert not crossing, f"{room} imports {sorted(crossing)}"


def test_room_rule_sees_a_crossing(tmp_path, monkeypatch):
    """The rule is not vacuous: a file importing the loop is reported."""
    room = tmp_path / "learner" / "algo"
    room.mkdir(parents=True)
    (room / "x.py").write_text("from learner.rl_loop import RLLoop\nimport learner.service.server\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert imported_learner_modules("learner.algo") == {
        "learner.rl_loop", "learner.rl_loop.RLLoop", "learner.service.server"}


CODE_MAPS = ("learner", "learner/algo", "learner/service", "learner/weights", "actors", "actors/weights", "models",
             "launch", "tandem_wire/weights")


@pytest.mark.parametrize("package", CODE_MAPS)
def test_each_code_map_names_every_module_of_its_package(package):
    """A package's README.md is its code map: a module missing from it is a room a reader cannot find."""
    code_map = (ROOT / package / "README.md").read_text()
    modules = sorted(p.name for p in (ROOT / package).glob("*.py") if p.name != "__init__.py")
    assert modules, package
    missing = [name for name in modules if f"`{name}`" not in code_map]
    assert not missing, f"{package}/README.md does not name {missing}"

"""Each role package imports only its own heavy dependencies (README.md, "Layout and layering").

Every module of a package is imported in a fresh interpreter in which the forbidden modules
cannot be imported at all (as if they were not installed), then `sys.modules` is checked. So
an optional `try: import torch` in a third-party library (tensorboardX does this) is fine, but
any real dependency of ours on a forbidden module fails. A fresh process is needed because the
test session itself has jax (and maybe vllm) loaded already.

Below that, the house's other rules: the learner's rooms import no floor above them, each package's code map
names every module, no import cycle inside a package, a wing imports nothing of the package above it, and the
hubs stay within their bounds.
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


CODE_MAPS = ("learner", "learner/algo", "learner/service", "learner/weights", "actors", "actors/samplers",
             "actors/weights", "models", "launch", "tandem_wire/weights")


@pytest.mark.parametrize("package", CODE_MAPS)
def test_each_code_map_names_every_module_of_its_package(package):
    """A package's README.md is its code map: a module missing from it is a room a reader cannot find."""
    code_map = (ROOT / package / "README.md").read_text()
    modules = sorted(p.name for p in (ROOT / package).glob("*.py") if p.name != "__init__.py")
    assert modules, package
    missing = [name for name in modules if f"`{name}`" not in code_map]
    assert not missing, f"{package}/README.md does not name {missing}"


# Inside the packages: no import cycle, type-only imports (under TYPE_CHECKING, or inside a function)
# included, since a reader follows those too.
CYCLE_FREE = ("actors", "learner", "launch", "models", "rewards", "tandem_wire")


def import_graph(packages: tuple[str, ...], root: Path = ROOT) -> dict[str, set[str]]:
    """Each module of `packages` -> the modules of `packages` its import statements name (`from a.b import
    c` names the module a.b.c when there is one, else a.b)."""
    paths = {".".join(p.relative_to(root).with_suffix("").parts).removesuffix(".__init__"): p
             for package in packages for p in (root / package).rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in paths.items():
        here = name if path.name == "__init__.py" else name.rpartition(".")[0]
        named: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join([*here.split(".")[:len(here.split(".")) - node.level + 1], *filter(None, [base])])
                named |= {f"{base}.{alias.name}" if f"{base}.{alias.name}" in paths else base for alias in node.names}
            elif isinstance(node, ast.Import):
                named |= {alias.name for alias in node.names}
        graph[name] = {module for module in named if module in paths and module != name}
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    order: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(module: str) -> None:
        order[module] = low[module] = len(order)
        stack.append(module)
        for dep in sorted(graph[module]):
            if dep not in order:
                visit(dep)
                low[module] = min(low[module], low[dep])
            elif dep in stack:
                low[module] = min(low[module], order[dep])
        if low[module] == order[module]:
            component = stack[stack.index(module):]
            del stack[stack.index(module):]
            if len(component) > 1:
                cycles.append(sorted(component))

    for module in sorted(graph):
        if module not in order:
            visit(module)
    return cycles


def test_no_import_cycle_inside_the_packages():
    assert import_cycles(import_graph(CYCLE_FREE)) == []


def test_the_cycle_rule_sees_a_type_only_cycle(tmp_path):
    """The rule is not vacuous: two modules that import each other, one of them only for a type, are a cycle."""
    wing = tmp_path / "pkg" / "wing"
    wing.mkdir(parents=True)
    (tmp_path / "pkg" / "engine.py").write_text("from pkg.wing import check\n")
    (wing / "__init__.py").write_text("")
    (wing / "check.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..engine import E\n")
    (wing / "free.py").write_text("from pkg.wing import check\n")
    graph = import_graph(("pkg",), tmp_path)
    assert graph["pkg.wing.check"] == {"pkg.engine"} and graph["pkg.wing.free"] == {"pkg.wing.check"}
    assert import_cycles(graph) == [["pkg.engine", "pkg.wing.check"]]


# A wing sits below the modules of the package that holds it: actors/weights/ imports nothing else of actors/
# (the engine is a Protocol to it, actors/weights/checks.py), learner's rooms none of its loops (above).
WINGS = {"actors.weights": "actors"}


@pytest.mark.parametrize("wing", sorted(WINGS))
def test_a_wing_imports_nothing_of_the_package_above_it(wing):
    above = WINGS[wing]
    upward = {f"{module} -> {dep}" for module, deps in import_graph((above,)).items() if module.startswith(wing)
              for dep in deps if not dep.startswith(wing)}
    assert not upward, sorted(upward)


# The hubs' bounds (issue 53): the service keeps the gRPC surface and delegates, the client its calls, and the
# README stays a user's page; past a bound, a concern wants a room of its own rather than more lines here.
MOST_LINES = {"learner/service/server.py": 599, "actors/learner_client.py": 559, "README.md": 250}
MOST_METHODS = 30  # of any class in learner/service/


def test_the_hubs_stay_within_their_bounds():
    over = {path: lines for path, most in MOST_LINES.items()
            if (lines := len((ROOT / path).read_text().splitlines())) > most}
    assert not over, f"lines: {over} (at most {MOST_LINES})"
    crowded = {f"{path.name}:{node.name}": methods for path in (ROOT / "learner" / "service").glob("*.py")
               for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.ClassDef)
               if (methods := sum(isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) for n in node.body))
               > MOST_METHODS}
    assert not crowded, f"methods: {crowded} (at most {MOST_METHODS})"

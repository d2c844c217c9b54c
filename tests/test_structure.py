"""The packages' shape: no import cycle, imports go down the pipeline.

Read with the standard library's ``ast`` (nothing is imported), so an import inside a function,
the kind that hid the old instance-table/loader cycle, counts like any other.
"""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("matrix", "entrypoint")
# matrix/'s rooms in pipeline order: a module may import its own room and the rooms before it.
ROOMS = ("errors", "model", "image", "jobs", "deploy", "cli")
# entrypoint/'s rooms in pipeline order (docs/architecture.md): settings and probes below the plan,
# the plan below the rendezvous and the run, nothing below importing the rendezvous server.
ENTRYPOINT_ROOMS = ("core", "schedulers", "probe", "launchers", "settings", "plan", "rendezvous",
                    "run")


def module_files(package: str) -> dict[str, Path]:
    """Dotted module name -> file, for every .py file of ``package``."""
    files = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        files[".".join(parts)] = path
    return files


ALL = {name: path for package in PACKAGES for name, path in module_files(package).items()}


def imported_modules(name: str, path: Path) -> set[str]:
    """The project modules ``name`` imports, at module level or inside functions."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            # ``from pkg import mod`` imports the module pkg.mod when there is one
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in ALL else base
                       for alias in node.names]
        else:
            continue
        found.update(t for t in targets if t in ALL and t != name)
    return found


@cache
def graph() -> dict[str, set[str]]:
    """Each project module's project imports: parsed when a test asks, not as the module is
    imported (1.5 s, in every collection of the suite)."""
    return {name: imported_modules(name, path) for name, path in ALL.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str]:
    """One import cycle as a path of module names, or [] when there is none."""
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done
    path: list[str] = []

    def visit(node: str) -> list[str]:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return []

    for start in sorted(graph):
        if start not in state and (cycle := visit(start)):
            return cycle
    return []


def test_the_cycle_finder_sees_a_cycle():
    """Guard for the checks below: a made-up a -> b -> a is found, a tree is not."""
    assert find_cycle({"a": {"b"}, "b": {"a"}}) == ["a", "b", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) == []


def test_the_graph_sees_lazy_and_relative_imports():
    """Imports inside functions count (matrix.cli.images imports the builder lazily)."""
    assert "matrix.image.build" in graph()["matrix.cli.images"]
    assert "matrix.model.schema" in graph()["matrix.model.instances"]


@pytest.mark.parametrize("package", PACKAGES)
def test_no_import_cycle(package):
    inside = {name: {t for t in targets if t.startswith(package)}
              for name, targets in graph().items() if name.startswith(package)}
    assert find_cycle(inside) == []


def room(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def test_every_matrix_module_lives_in_a_room():
    """matrix/ holds only its __init__, errors.py and the rooms' subpackages."""
    loose = [name for name in module_files("matrix") if room(name) not in ROOMS + ("__init__",)]
    assert loose == []
    assert {room(name) for name in module_files("matrix")} == set(ROOMS) | {"__init__"}


def test_matrix_imports_only_go_down_the_pipeline():
    assert uphill_imports("matrix", ROOMS) == []


def uphill_imports(package: str, rooms: tuple[str, ...]) -> list[str]:
    """``a imports b`` for every import of ``package`` from a room after its own."""
    uphill = []
    for name, targets in graph().items():
        if not name.startswith(package + ".") or room(name) in ("__init__", "__main__"):
            continue
        for target in targets:
            if target.startswith(package + ".") and \
                    rooms.index(room(target)) > rooms.index(room(name)):
                uphill.append(f"{name} imports {target}")
    return sorted(uphill)


def test_every_entrypoint_module_lives_in_a_room():
    """entrypoint/ holds only its __init__ and __main__ and the rooms' subpackages."""
    names = module_files("entrypoint")
    loose = [name for name in names if room(name) not in ENTRYPOINT_ROOMS + ("__init__", "__main__")]
    assert loose == []
    assert {room(name) for name in names} == set(ENTRYPOINT_ROOMS) | {"__init__", "__main__"}


def test_entrypoint_imports_only_go_down_the_pipeline():
    assert uphill_imports("entrypoint", ENTRYPOINT_ROOMS) == []


def test_the_uphill_check_sees_an_uphill_import(monkeypatch):
    """Guard: a probe that imported the plan would be reported."""
    monkeypatch.setitem(graph(), "entrypoint.probe.facts",
                        graph()["entrypoint.probe.facts"] | {"entrypoint.plan.make"})
    assert uphill_imports("entrypoint", ENTRYPOINT_ROOMS) == [
        "entrypoint.probe.facts imports entrypoint.plan.make"]


def test_the_entrypoint_imports_nothing_from_matrix():
    """The entrypoint runs inside images, where matrix/ is not installed."""
    assert [n for n, t in graph().items() if n.startswith("entrypoint")
            and any(x.startswith("matrix") for x in t)] == []


ARROWS = re.compile(r"(\w+(?: → \w+)+)")


def architecture_chains() -> list[list[str]]:
    text = " ".join((ROOT / "docs" / "architecture.md").read_text(encoding="utf-8").split())
    return [chain.split(" → ") for chain in ARROWS.findall(text) if chain.count("→") > 2]


def test_the_architecture_page_states_the_import_order_the_code_has():
    """docs/architecture.md's arrows mean "imports" (issue 36): its two chains are the rooms
    this file checks the code against, top to bottom."""
    chains = architecture_chains()
    assert list(reversed(ROOMS)) in chains, chains
    assert list(reversed(ENTRYPOINT_ROOMS)) in chains, chains


def test_matrix_imports_the_entrypoint_as_the_page_says():
    """The page says matrix/ imports entrypoint/ on purpose and never the reverse."""
    assert any(x.startswith("entrypoint") for n, t in graph().items() if n.startswith("matrix")
               for x in t)
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    assert "`matrix/` also imports\n`entrypoint/`" in text or "also imports `entrypoint/`" in \
        " ".join(text.split())

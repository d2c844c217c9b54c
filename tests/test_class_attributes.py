"""No class reads an attribute that only a subclass defines (issue 36).

A base class whose methods read ``self.x`` where only a subclass sets ``x`` (a class split in
two files by inheritance, as ``rendezvous.peers.Peers`` was of ``connection.Connections``) works
only as part of that subclass, and nothing in the base says what it needs. Every class of
``entrypoint/`` and ``matrix/`` is read here: each name its methods read on ``self`` must be
defined by the class or a base class, as a method, property, class attribute, annotated field,
``__slots__`` entry, or an assignment to ``self.<name>`` in one of their methods. A hook a
subclass fills in is declared in the base (a method that raises ``NotImplementedError``).
"""

from __future__ import annotations

import ast
import enum
import importlib
import inspect
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("entrypoint", "matrix")


def module_names() -> list[tuple[str, Path]]:
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found.append((".".join(parts), path))
    return found


_CLASSES: dict[Path, dict[str, ast.ClassDef]] = {}


def class_nodes(path: Path) -> dict[str, ast.ClassDef]:
    if path not in _CLASSES:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        _CLASSES[path] = {node.name: node for node in tree.body if isinstance(node, ast.ClassDef)}
    return _CLASSES[path]


def self_attributes(node: ast.ClassDef) -> tuple[dict[str, int], set[str]]:
    """(name -> first line where a method reads ``self.name``, names assigned to ``self``)."""
    reads: dict[str, int] = {}
    writes: set[str] = set()
    for method in node.body:
        if not isinstance(method, (ast.FunctionDef, ast.AsyncFunctionDef)) or not method.args.args:
            continue
        if method.args.args[0].arg != "self":
            continue  # a classmethod's or staticmethod's first argument is not the instance
        for sub in ast.walk(method):
            if isinstance(sub, ast.Attribute) and isinstance(sub.value, ast.Name) \
                    and sub.value.id == "self":
                if isinstance(sub.ctx, ast.Store):
                    writes.add(sub.attr)
                else:
                    reads.setdefault(sub.attr, sub.lineno)
    return reads, writes


def defined(cls: type, root: Path) -> set[str]:
    """Every name an instance of ``cls`` has by its own class or a base class (those under
    ``root`` read from their source too)."""
    names = set(dir(cls))
    if issubclass(cls, enum.Enum):
        names |= {"name", "value"}  # each member's, not the class's
    for klass in cls.__mro__:
        names |= set(vars(klass).get("__annotations__", {}))
        slots = vars(klass).get("__slots__", ())
        names |= {slots} if isinstance(slots, str) else set(slots)
        try:
            source = Path(inspect.getsourcefile(klass) or "")
        except TypeError:  # a built-in class
            continue
        if root in source.parents and klass.__name__ in class_nodes(source):
            names |= self_attributes(class_nodes(source)[klass.__name__])[1]
    return names


def undefined_reads(module: str, path: Path, root: Path = ROOT) -> list[str]:
    loaded = importlib.import_module(module)
    found = []
    for name, node in class_nodes(path).items():
        cls = getattr(loaded, name, None)
        if not inspect.isclass(cls):
            continue
        reads = self_attributes(node)[0]
        known = defined(cls, root)
        found += [f"{path.relative_to(root).as_posix()}:{line} {name}.{attr}"
                  for attr, line in sorted(reads.items()) if attr not in known]
    return found


def test_no_class_reads_an_attribute_only_a_subclass_defines():
    found = [line for module, path in module_names() for line in undefined_reads(module, path)]
    assert not found, "attributes read on self that the class and its bases never define:\n" + \
        "\n".join(found)


def test_the_check_sees_a_mixin_reading_its_subclass(tmp_path, monkeypatch):
    """The shape ``Peers`` had: a base whose method reads what only its subclass sets."""
    package = tmp_path / "mixin_probe"
    package.mkdir()
    (package / "__init__.py").write_text("")
    source = package / "split.py"
    source.write_text(
        "class Base(object):\n"
        "    def run(self):\n"
        "        return self._sel, self.declared, self._hook()\n"
        "    def _hook(self):\n"
        "        raise NotImplementedError\n"
        "    declared = 1\n\n"
        "class Whole(Base):\n"
        "    def __init__(self):\n"
        "        self._sel = None\n"
        "    def _hook(self):\n"
        "        return self._sel\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    found = undefined_reads("mixin_probe.split", source, tmp_path)
    assert found == ["mixin_probe/split.py:3 Base._sel"], found


"""The entrypoint must run on Python 3.6 (Ubuntu 18.04 images) with the standard library only."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "entrypoint"


def test_minimum_version_is_3_6_or_lower():
    vermin = Path(sys.executable).with_name("vermin")
    if not vermin.exists():
        pytest.skip("vermin is not installed (pip install -e .[dev])")
    result = subprocess.run([str(vermin), "-t=3.6-", "--no-tips", "--violations",
                             "--eval-annotations", str(PACKAGE)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    assert result.returncode == 0, result.stdout


def imported_modules():
    found = set()
    for path in PACKAGE.rglob("*.py"):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                found.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                found.add(node.module.split(".")[0])
    return found


def test_standard_library_only():
    outside = sorted(m for m in imported_modules() if m not in sys.stdlib_module_names)
    assert outside == []


def test_no_modules_added_after_3_6():
    # stdlib modules that do not exist on 3.6
    newer = {"dataclasses", "contextvars", "importlib_resources", "graphlib", "zoneinfo",
             "tomllib"}
    assert not imported_modules() & newer


def test_compiles_with_36_grammar():
    for path in PACKAGE.rglob("*.py"):
        ast.parse(path.read_text(), str(path), feature_version=(3, 6))

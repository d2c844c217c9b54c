"""bench/break_features.py stays runnable: every break still finds the text it replaces, and
every test it names still exists. A stale break is reported by the script and passes nothing,
so it is caught here, on every pull request, rather than when someone next runs the script
(the unit step's break went stale once, unseen, when `--no-loadscope-reorder` was added)."""

from __future__ import annotations

import importlib.util
import sys

import pytest

from matrix.model.settings import ROOT


def _breaks():
    spec = importlib.util.spec_from_file_location("break_features",
                                                  ROOT / "bench" / "break_features.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module.BREAKS


@pytest.mark.parametrize("brk", _breaks(), ids=lambda brk: brk.name)
def test_each_break_still_applies_to_the_tree_and_names_real_tests(brk):
    for path, old, _ in brk.edits:
        assert old in (ROOT / path).read_text(encoding="utf-8"), f"{brk.name}: {path}: {old!r}"
    for test, _ in brk.tests:
        target = test.split()[0]
        file, _, name = target.partition("::")
        assert (ROOT / file).is_file(), f"{brk.name}: {file}"
        if name:
            assert f"def {name.split('[')[0]}(" in (ROOT / file).read_text(encoding="utf-8"), \
                f"{brk.name}: {target}"

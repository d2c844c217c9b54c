"""Dry runs of layer tests, many layers in one process: ``python tests/layer_dry_run.py JOBS``.

``JOBS`` is a JSON list of ``{"args": [...], "code": FILE}``: each entry is one pytest session
(``pytest.main(args)``, the arguments ``invoke test`` gives a layer's run: its test files,
``--mnp-layer``, ``--hosts``, ``--junitxml``), and its exit code is written to ``FILE``. Every
phase of a layer test runs (collection with ``--mnp-layer``, skip marks, fixtures, the layer
description) except the test function's body, which needs a container of the layer's image.

One session per layer, as in ``invoke test``, but one interpreter for all of them: starting
Python and importing pytest and testinfra for each of 72 layers took about a minute of CPU per
suite run. The layers' test modules hold no state that depends on the layer (they read it from
the session's ``layer`` fixture), so importing them once serves every session.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest


class DryRun:
    """A pytest plugin: the test function's body is not called (the call phase passes)."""

    @pytest.hookimpl(tryfirst=True)
    def pytest_pyfunc_call(self, pyfuncitem: pytest.Function) -> bool:  # noqa: ARG002
        return True


def main(jobs_file: str) -> int:
    for job in json.loads(Path(jobs_file).read_text(encoding="utf-8")):
        code = pytest.main(job["args"], plugins=[DryRun()])
        Path(job["code"]).write_text(str(int(code)), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))

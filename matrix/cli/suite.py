"""``invoke check``: the whole test suite as CI runs it (ruff, lint, pytest)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from matrix.errors import UserError
from matrix.model.settings import ROOT


def check(pytest_args: str) -> None:
    """The whole suite: ruff, rendered-files freshness + hadolint, then pytest (real engine)."""
    import shlex

    from matrix.image import engine

    engine.ensure_system_tools()
    engine.ensure()
    bin_dir = Path(sys.executable).parent
    steps = [
        ("ruff", [str(bin_dir / "ruff"), "check", "."]),
        ("lint", [str(bin_dir / "invoke"), "lint"]),
        ("pytest", [sys.executable, "-m", "pytest", *shlex.split(pytest_args)]),
    ]
    for name, command in steps:
        print(f"== {name}: {' '.join(command)}", flush=True)
        if subprocess.run(command, cwd=ROOT, check=False).returncode:
            raise UserError(f"check failed at step {name}")
    print("== all checks passed")



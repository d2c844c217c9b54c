"""The committed copy of every rendered Dockerfile, under ``images/generated/<stack>/``.

Reviewers read Dockerfile diffs in pull requests; :func:`stale` tells CI when the copy no longer
matches what the templates and the matrix render. Files are written to a temporary folder and
swapped in, so an error never leaves a half-written tree.

The entrypoint's instance table (``entrypoint/probe/instances.py``, rendered from
``matrix/model/instances.yaml``) is a generated file too: :func:`write_entrypoint_table` and
:func:`stale_entrypoint_table` do for it what :func:`write` and :func:`stale` do for Dockerfiles.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from matrix.image.plan import Plan
from matrix.image.render import ENTRYPOINT_TABLE, render_entrypoint_table
from matrix.model.instances import TABLE
from matrix.model.settings import GENERATED, ROOT


def expected(plan: Plan) -> dict[str, str]:
    """Relative path -> content of every generated file for the planned stacks."""
    files = {}
    for stack, refs in plan.chains.items():
        for index, ref in enumerate(refs, start=1):
            layer = plan.layers[ref]
            name = "stack" if layer.component == "_stack" else layer.component
            files[f"{stack}/{index:02d}-{name}.Dockerfile"] = layer.dockerfile
    return files


def write(plan: Plan, out: Path = GENERATED) -> list[str]:
    """Replace the generated folders of the planned stacks; returns the paths written."""
    files = expected(plan)
    out.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".render-", dir=out))
    try:
        for rel, text in files.items():
            target = staging / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text, encoding="utf-8")
        for stack in plan.chains:
            final = out / stack
            if final.exists():
                shutil.rmtree(final)
            (staging / stack).rename(final)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return sorted(files)


def stale(plan: Plan, out: Path = GENERATED, all_stacks: bool = True) -> list[str]:
    """Generated files that differ from a fresh render, are missing, or belong to no stack."""
    files = expected(plan)
    problems = []
    for rel, text in files.items():
        path = out / rel
        if not path.is_file():
            problems.append(f"{rel} (missing)")
        elif path.read_text(encoding="utf-8") != text:
            problems.append(f"{rel} (differs)")
    if all_stacks and out.is_dir():
        on_disk = {p.relative_to(out).as_posix() for p in out.rglob("*.Dockerfile")}
        problems += [f"{rel} (no longer rendered)" for rel in sorted(on_disk - set(files))]
    return problems


def write_entrypoint_table(target: Path = ENTRYPOINT_TABLE, table: Path = TABLE) -> bool:
    """Render the entrypoint's instance table into ``target`` when it differs (swapped in whole);
    True when the file was written. Run before planning: the images hash the entrypoint."""
    text = render_entrypoint_table(table)
    if target.is_file() and target.read_text(encoding="utf-8") == text:
        return False
    # a sibling written with the usual mode (mkstemp's 0600 would reach the images), then renamed
    staging = target.with_name(f".render-{os.getpid()}-{target.name}")
    try:
        staging.write_text(text, encoding="utf-8")
        staging.replace(target)
    finally:
        staging.unlink(missing_ok=True)
    return True


def stale_entrypoint_table(target: Path = ENTRYPOINT_TABLE, table: Path = TABLE) -> str | None:
    """Why ``target`` is not what the instance table renders now (missing, differs), or None."""
    shown = target.relative_to(ROOT).as_posix() if target.is_relative_to(ROOT) else str(target)
    if not target.is_file():
        return f"{shown} (missing)"
    if target.read_text(encoding="utf-8") != render_entrypoint_table(table):
        return f"{shown} (differs from what {table.name} renders)"
    return None

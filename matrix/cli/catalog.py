"""Tasks about the stacks file and its plan: ``stacks``, ``render``, ``plan``, ``lint``,
``matrix``, ``pin``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from rich.table import Table

from matrix.cli.options import (
    console,
    default_stack,
    emit_json,
    generated_dir,
    load,
    pick_stacks,
    shown,
)
from matrix.errors import UserError
from matrix.image import generated
from matrix.image.plan import Plan, plan
from matrix.model.entities import Matrix
from matrix.model.rules import check_matrix
from matrix.model.settings import GENERATED, ROOT

# --- stacks --------------------------------------------------------------------------------------

def stacks_data(matrix: Matrix) -> list[dict[str, Any]]:
    """Every stack with its base, component versions, targets and rule check, as data."""
    rows = []
    for name, violations in check_matrix(matrix).items():
        stack = matrix.stacks[name]
        rows.append({
            "name": name, "default": name == default_stack(matrix),
            "base": {"name": stack.base.name, "image": stack.base.image,
                     "provides": dict(stack.base.provides)},
            "layers": [{"component": layer.component, "version": layer.version}
                       for layer in stack.layers],
            "instances": list(stack.instances), "fabric": stack.fabric,
            "valid": not violations,
            "violations": [f"{v.trigger} needs {v.component} {' or '.join(v.wanted)} "
                           f"(found {v.found or 'none'}) [{v.rule.id}]" for v in violations],
        })
    return rows


def component_parts(row: dict[str, Any]) -> list[str]:
    """``name version`` for what the base provides, then each layer; a component that is both
    (python on the debian-12 bases) is shown once, as its layer."""
    layered = {layer["component"] for layer in row["layers"]}
    parts = [f"{k} {v}" for k, v in row["base"]["provides"].items() if k not in layered]
    return parts + [f"{layer['component']} {layer['version']}" for layer in row["layers"]]


def show_stacks(stacks_file: str, as_json: bool = False, names_only: bool = False) -> None:
    """Table of every stack with its versions, targets and whether it passes the rules."""
    matrix = load(stacks_file)
    if names_only:  # for shell completion: no rule check, one name a line
        print("\n".join(matrix.stacks))
        return
    rows = stacks_data(matrix)
    if as_json:
        emit_json({"file": str(matrix.path), "default_stack": default_stack(matrix),
                   "stacks": rows})
    else:
        table = Table(title=f"stacks in {matrix.path}", show_lines=True)
        for column in ("stack", "base", "components", "instances", "status"):
            table.add_column(column, overflow="fold")
        for row in rows:
            parts = component_parts(row)
            status = "valid" if row["valid"] else "INVALID: " + "; ".join(row["violations"])
            name = row["name"] + (" (default)" if row["default"] else "")
            table.add_row(name, row["base"]["image"], ", ".join(parts), ", ".join(row["instances"]),
                          status)
        console.print(table)
    bad = sum(not row["valid"] for row in rows)
    if bad:
        raise UserError(f"{bad} stack(s) in {matrix.path} break compatibility rules")


# --- render, plan, lint, matrix -------------------------------------------------------------------

def render(stacks_file: str, stacks: Any, all_stacks: bool) -> list[Path]:
    matrix = load(stacks_file)
    result = plan(matrix, pick_stacks(matrix, stacks, all_stacks))
    out = generated_dir(matrix)
    written = [out / rel for rel in generated.write(result, out)]
    for path in written:
        print(f"wrote {shown(path)}")
    if out != GENERATED:
        print(f"{len(written)} file(s) under {shown(out)}/ (next to {shown(matrix.path)})")
    return written


def _local_tags(matrix: Matrix) -> set[str] | None:
    """Tags of the repository in a running engine; None when no engine answers (none started)."""
    from matrix.image import engine

    try:
        client = engine.connect(timeout=20)
        return {tag for image in client.images.list(name=matrix.repository) for tag in image.tags}
    except UserError:
        return None


def plan_data(result: Plan, names: list[str], local: set[str] | None) -> dict[str, Any]:
    layers = result.order(names)
    index = {layer.ref: number for number, layer in enumerate(layers, start=1)}
    bases = {s.base.image: s.base.name for s in result.matrix.stacks.values()}
    rows = []
    for layer in layers:
        rows.append({
            "number": index[layer.ref],
            "component": "stack" if layer.component == "_stack" else layer.component,
            "version": layer.version, "ref": layer.ref, "tag": layer.tag,
            "parent": layer.parent,
            "parent_number": index.get(layer.parent),
            "base": bases.get(layer.parent),
            "stacks": list(layer.stacks),
            "present": None if local is None else layer.ref in local,
        })
    return {"stacks": names, "engine": local is not None, "layers": rows,
            "to_build": None if local is None else sum(not r["present"] for r in rows)}


def _by_base(rows: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Plan rows grouped by the base image their chain starts from (parents come first)."""
    root: dict[int, str] = {}
    groups: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        if row["parent_number"]:
            key = root[row["parent_number"]]
        else:
            key = f"{row['base']} ({row['parent']})" if row["base"] else row["parent"]
        root[row["number"]] = key
        groups.setdefault(key, []).append(row)
    return groups


def show_plan(stacks_file: str, stacks: Any, all_stacks: bool, as_json: bool = False) -> Plan:
    matrix = load(stacks_file)
    names = pick_stacks(matrix, stacks, all_stacks)
    result = plan(matrix, names)
    data = plan_data(result, names, _local_tags(matrix))
    if as_json:
        emit_json(data)
        return result
    width = max(len(r["tag"]) for r in data["layers"])
    for base, rows in _by_base(data["layers"]).items():
        table = Table(title=f"from {base}", title_justify="left")
        table.add_column("#", justify="right")
        table.add_column(f"image tag ({matrix.repository}:...)", no_wrap=True, min_width=width)
        table.add_column("from", no_wrap=True)
        table.add_column("stacks")
        if data["engine"]:
            table.add_column("built", no_wrap=True)
        for row in rows:
            users = (f"all {len(names)}" if len(row["stacks"]) == len(names) > 1
                     else ", ".join(row["stacks"]))
            cells = [str(row["number"]), row["tag"],
                     f"#{row['parent_number']}" if row["parent_number"] else "base", users]
            if data["engine"]:
                cells.append("yes" if row["present"] else "-")
            table.add_row(*cells)
        console.print(table)
    total = len(data["layers"])
    shared = sum(len(r["stacks"]) > 1 for r in data["layers"])
    if data["engine"]:
        print(f"{total} layers for {len(names)} stack(s), {shared} shared; "
              f"{total - data['to_build']} present locally, {data['to_build']} to build")
    else:
        print(f"{total} layers for {len(names)} stack(s), {shared} shared; no Docker engine "
              "answers: built layers not checked")
    return result


def lint(stacks_file: str) -> None:
    """Generated Dockerfiles are fresh and pass hadolint; one line on success."""
    matrix = load(stacks_file)
    result = plan(matrix)
    out = generated_dir(matrix)
    problems = generated.stale(result, out)
    if problems:
        flag = "" if out == GENERATED else f" --stacks {shown(matrix.path)}"
        raise UserError(f"rendered Dockerfiles are stale ({problems[0]}"
                        f"{f' and {len(problems) - 1} more' if len(problems) > 1 else ''}); "
                        f"run `invoke render --all{flag}` and commit {shown(out)}/")
    files = sorted(str(p) for p in out.rglob("*.Dockerfile"))
    hadolint = Path(sys.executable).parent / "hadolint"
    command = [str(hadolint) if hadolint.exists() else "hadolint", "--no-color",
               "-c", str(ROOT / ".hadolint.yaml"), *files]
    try:
        proc = subprocess.run(command, capture_output=True, text=True, check=False)
    except FileNotFoundError:
        raise UserError("hadolint not found; install the dev extra: pip install -e '.[dev]'") from None
    if proc.returncode:
        sys.stdout.write(proc.stdout)  # findings only matter when they fail the check
        raise UserError(f"hadolint found problems in the rendered Dockerfiles (exit {proc.returncode})")
    print(f"{len(files)} rendered Dockerfiles are fresh and pass hadolint")


def ci_matrix(stacks_file: str) -> dict[str, Any]:
    """GitHub Actions strategy for the valid stacks that name a CI runner, ready for fromJson."""
    matrix = load(stacks_file)
    valid = {name for name, v in check_matrix(matrix).items() if not v}
    include = [{"stack": name, "runner": stack.ci_runner, "fabric": stack.fabric,
                "base": stack.base.image}
               for name, stack in matrix.stacks.items() if stack.ci_runner and name in valid]
    strategy = {"include": include}
    print(json.dumps(strategy, separators=(",", ":")))
    return strategy


def pin(stacks_file: str, check_only: bool) -> None:
    """`invoke pin [--check]`: see :mod:`matrix.pin`."""
    from matrix.model import pin as pinning

    pinning.run(stacks_file, check_only)



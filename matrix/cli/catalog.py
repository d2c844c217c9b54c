"""Tasks about the stacks file and its plan: ``stacks``, ``render``, ``plan``, ``lint``,
``matrix``, ``pin``.

Heavy modules (the planner, jinja2, jsonschema, docker) are imported inside the tasks that need
them: completion runs ``invoke stacks --names`` and ``invoke --complete`` on every Tab, and both
import this module.
"""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path
from typing import TYPE_CHECKING, Any

from matrix.cli.options import (
    LAUNCHERS,
    console,
    default_stack,
    emit_json,
    generated_dir,
    load,
    pick_stacks,
    shown,
)
from matrix.errors import UserError
from matrix.model.entities import Matrix
from matrix.model.settings import GENERATED, ROOT

if TYPE_CHECKING:
    from matrix.image.plan import Plan
    from matrix.model.violation import Violation

# --- stacks --------------------------------------------------------------------------------------

def stacks_data(matrix: Matrix) -> list[dict[str, Any]]:
    """Every stack with its base, component versions, targets, rule check and whether it can be
    built yet, as data."""
    from matrix.model.drivers import driver_floor
    from matrix.model.instances import INSTANCE_TYPES
    from matrix.model.rules import check_matrix

    rows = []
    for name, violations in check_matrix(matrix).items():
        stack = matrix.stacks[name]
        floor = driver_floor(stack)
        rows.append({
            "name": name, "default": name == default_stack(matrix),
            "base": {"name": stack.base.name, "image": stack.base.image,
                     "provides": dict(stack.base.provides)},
            "layers": [{"component": layer.component, "version": layer.version,
                        **({"options": layer.stack_options} if layer.stack_options else {})}
                       for layer in stack.layers],
            "instances": list(stack.instances), "fabric": stack.fabric,
            "valid": not violations,
            "violations": [_violation_text(v) for v in violations],
            "buildable": not stack.unpinned(),
            "unpinned": stack.unpinned(),
            "driver": floor.to_dict() if floor else None,  # issue 33: the host's NVIDIA driver
            # issue 32: what the instance table says whoever picks one of these types must read
            "notices": [INSTANCE_TYPES[i].notice for i in stack.instances
                        if i in INSTANCE_TYPES and INSTANCE_TYPES[i].notice],
        })
    return rows


def _violation_text(violation: Violation) -> str:
    """One broken rule as ``invoke stacks`` lists it: a pairwise rule as what needs what with the
    rule and its source, a rule class as its own sentence plus which class fired, why the class
    exists and its source."""
    from matrix.model.violation import ANY_VERSION

    v = violation
    if v.rule.kind == "class":
        return f"{v.sentence} [{v.named}: {v.rule.why}; source: {v.rule.source}]"
    wanted = " or ".join(v.wanted)
    needs = v.component if wanted == ANY_VERSION else f"{v.component} {wanted}"
    return (f"{v.trigger} needs {needs} (found {v.found or 'none'}) "
            f"[{v.named}; source: {v.rule.source}]")


def component_parts(row: dict[str, Any]) -> list[str]:
    """``name version`` for what the base provides, then each layer, with the options its stack
    gives it (``python 3.11.2 (pip: false)``); a component that is both (python on the debian-12
    bases) is shown once, as its layer."""
    layered = {layer["component"] for layer in row["layers"]}
    parts = [f"{k} {v}" for k, v in row["base"]["provides"].items() if k not in layered]
    return parts + [f"{layer['component']} {layer['version']}{_options_text(layer)}"
                    for layer in row["layers"]]


def _options_text(layer: dict[str, Any]) -> str:
    """`` (key: value, ...)`` for the options a stack gives its layer, values as JSON writes them."""
    options = layer.get("options") or {}
    return f" ({', '.join(f'{k}: {json.dumps(v)}' for k, v in options.items())})" if options else ""


def status(row: dict[str, Any]) -> str:
    """valid; or INVALID and the rules it breaks; or why it cannot be built yet."""
    if not row["valid"]:
        return "INVALID: " + "; ".join(row["violations"])
    if not row["buildable"]:
        return f"valid, NOT BUILDABLE YET: {unpinned_text(row['unpinned'])}"
    return "valid"


def unpinned_text(labels: list[str]) -> str:
    """'X has no sha256 pin ...' for the layers that fail closed (``Stack.unpinned``)."""
    one = len(labels) == 1
    return (f"{', '.join(labels)} {'has' if one else 'have'} no sha256 pin (`download`) in the "
            f"stacks file, so {'its layer fails' if one else 'their layers fail'} closed")


def stack_names(stacks_file: str) -> list[str]:
    """The stack names of a stacks file, read without checking it: completion asks for them on
    every Tab, so this reads YAML only (no schema, no rules); the other tasks check the file."""
    from matrix.model import yamlsrc

    path = Path(stacks_file)
    if not path.is_file():
        load(stacks_file)  # the one-line error every task gives for a missing file
    data = yamlsrc.load(path).data
    stacks = data.get("stacks") if isinstance(data, dict) else None
    if not isinstance(stacks, dict):
        raise UserError(f"{path}: expected a mapping with a `stacks` mapping")
    return [str(name) for name in stacks]


def show_names(stacks_file: str, what: str = "stacks") -> None:
    """One name a line, for shell completion: stacks, instance types or launchers."""
    if what == "instance-types":
        from matrix.model.instances import instance_names

        names = instance_names()
    elif what == "launchers":
        names = list(LAUNCHERS)
    else:
        names = stack_names(stacks_file)
    print("\n".join(names))


def option_values(option: str, stacks_file: str = "stacks.yaml") -> list[str]:
    """The values ``--OPTION`` takes, from the options the tasks declare (completion: ``invoke
    stacks --values OPTION``); none for an option that takes any value."""
    from matrix.cli import jobtasks

    return jobtasks.option_values(option, stacks_file)


def show_stacks(stacks_file: str, as_json: bool = False, names_only: bool = False) -> None:
    """Every stack with its versions, targets, whether it passes the rules and whether it can
    be built yet."""
    if names_only:  # for shell completion: no rule check, one name a line
        show_names(stacks_file)
        return
    matrix = load(stacks_file)
    rows = stacks_data(matrix)
    if as_json:
        emit_json({"file": str(matrix.path), "default_stack": default_stack(matrix),
                   "stacks": rows})
    else:
        _print_blocks(matrix, rows, console().width)
    bad = sum(not row["valid"] for row in rows)
    if bad:
        raise UserError(f"{bad} stack(s) in {matrix.path} break compatibility rules")


def pack(items: list[str], width: int, indent: str) -> list[str]:
    """``items`` joined with ", " into lines of at most ``width`` characters, each item whole
    (a component and its version stay on one line); an item longer than a line gets its own."""
    lines: list[str] = []
    line = ""
    for number, item in enumerate(items):
        item += "," if number < len(items) - 1 else ""
        if line and len(indent) + len(line) + 1 + len(item) > width:
            lines.append(line)
            line = item
        else:
            line = f"{line} {item}" if line else item
    return [indent + text for text in [*lines, line]]


def _field(label: str, items: list[str], width: int) -> list[str]:
    """``  label: items`` wrapped under the label; a single long value (a registry path) that
    does not fit after the label goes whole on the next line."""
    head = f"  {label + ':':<12}"
    lines = pack(items, width, " " * len(head))
    first = lines[0][len(head):]
    if len(head) + len(first) > width and len(items) == 1:
        return [head.rstrip(), "    " + first]
    return [head + first, *lines[1:]]


def _print_blocks(matrix: Matrix, rows: list[dict[str, Any]], width: int) -> None:
    """One block a stack, as wide as the terminal (or COLUMNS, or 100 piped): lines break only
    between whole names (a component and its version stay together), never inside one, which a
    five-column table cannot promise for registry paths such as Habana's 91-character image."""
    out = [f"stacks in {matrix.path}"]
    for row in rows:
        name = row["name"] + (" (default)" if row["default"] else "")
        out.append("")
        out.extend(textwrap.wrap(f"{name}: {status(row)}", width, subsequent_indent="    ",
                                 break_long_words=False, break_on_hyphens=False))
        out.extend(_field("base", [row["base"]["image"]], width))
        out.extend(_field("components", component_parts(row), width))
        out.extend(_field("instances", row["instances"], width))
        if row["driver"]:
            out.extend(textwrap.wrap(f"  {'driver:':<12}{row['driver']['line']}", width,
                                     subsequent_indent=" " * 14, break_long_words=False,
                                     break_on_hyphens=False))
        for notice in row["notices"]:
            out.extend(textwrap.wrap(f"  {'notice:':<12}{notice}", width,
                                     subsequent_indent=" " * 14, break_long_words=False,
                                     break_on_hyphens=False))
    print("\n".join(out))


# --- render, plan, lint, matrix -------------------------------------------------------------------

def render(stacks_file: str, stacks: Any, all_stacks: bool) -> list[Path]:
    from matrix.image import generated
    from matrix.image.plan import plan

    matrix = load(stacks_file)
    names = pick_stacks(matrix, stacks, all_stacks)
    if generated.write_entrypoint_table(generated.ENTRYPOINT_TABLE):  # first: the plan hashes the entrypoint
        print(f"wrote {shown(generated.ENTRYPOINT_TABLE)}")
    result = plan(matrix, names, engine=None)  # bases as stacks.yaml names them: no engine's state
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
        # the engine's summaries (GET /images/json) carry the tags; docker-py's images.list()
        # would inspect every image once more
        return {tag for summary in client.api.images(name=matrix.repository)
                for tag in summary.get("RepoTags") or () if tag != "<none>:<none>"}
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
            "platform": layer.platform,
            "parent": layer.parent,
            "parent_number": index.get(layer.parent),
            "base": bases.get(layer.parent),
            "stacks": list(layer.stacks),
            "present": None if local is None else layer.ref in local,
        })
    digests = {name: {"image": b.image, "digest": b.digest, "source": b.source}
               for name, b in result.bases.items()}
    return {"stacks": names, "engine": local is not None, "bases": digests, "layers": rows,
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
    from rich.table import Table

    from matrix.image.plan import plan

    matrix = load(stacks_file)
    names = pick_stacks(matrix, stacks, all_stacks)
    result = plan(matrix, names)
    data = plan_data(result, names, _local_tags(matrix))
    if as_json:
        emit_json(data)
        return result
    for base in data["bases"].values():  # two lines: a registry path alone can fill a line
        print(f"base {base['image']}" if len(base["image"]) <= 95 else f"base\n  {base['image']}")
        print(f"  {base['digest'] or '-'} ({base['source']})")
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
        console().print(table)
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
    """The entrypoint's instance table and the generated Dockerfiles are fresh and the
    Dockerfiles pass hadolint; one line on success."""
    from matrix.image import generated, hadolint
    from matrix.image.plan import plan

    matrix = load(stacks_file)
    table = generated.stale_entrypoint_table(generated.ENTRYPOINT_TABLE)
    if table:
        raise UserError(f"the entrypoint's instance table is stale ({table}); run "
                        f"`invoke render --all` and commit {shown(generated.ENTRYPOINT_TABLE)}")
    result = plan(matrix, engine=None)
    out = generated_dir(matrix)
    problems = generated.stale(result, out)
    if problems:
        flag = "" if out == GENERATED else f" --stacks {shown(matrix.path)}"
        raise UserError(f"rendered Dockerfiles are stale ({problems[0]}"
                        f"{f' and {len(problems) - 1} more' if len(problems) > 1 else ''}); "
                        f"run `invoke render --all{flag}` and commit {shown(out)}/")
    files = sorted(out.rglob("*.Dockerfile"))
    hadolint.check(files, ROOT / ".hadolint.yaml")
    print(f"{len(files)} rendered Dockerfiles are fresh and pass hadolint")


def ci_matrix(stacks_file: str) -> dict[str, Any]:
    """GitHub Actions strategy for the stacks CI can build, ready for fromJson, on stdout; on
    stderr, each stack left out and why (so the JSON stays clean for `$(invoke matrix)`)."""
    matrix = load(stacks_file)
    include, left_out = [], []
    for row in stacks_data(matrix):
        stack = matrix.stacks[row["name"]]
        why = _not_in_ci(row, stack.ci_runner)
        if why:
            left_out.append(f"{row['name']} ({why})")
        else:
            # publish.yml runs each stack on its runner (rule class ci-runner-platform holds the
            # runner's architecture equal to the platform), so the build there is native
            include.append({"stack": row["name"], "runner": stack.ci_runner,
                            "platform": stack.platform, "fabric": stack.fabric,
                            "base": stack.base.image})
    strategy = {"include": include}
    print(json.dumps(strategy, separators=(",", ":")))
    if left_out:
        print(f"left out of the CI matrix: {'; '.join(left_out)}", file=sys.stderr)
    return strategy


def _not_in_ci(row: dict[str, Any], runner: str | None) -> str:
    """Why CI does not build a stack ('' when it does): it breaks rules, cannot be built yet,
    or names no runner (`ci: {runner: ...}` in the stacks file)."""
    if not row["valid"]:
        return f"breaks {len(row['violations'])} compatibility rule(s); see invoke stacks"
    if not row["buildable"]:
        return f"not buildable yet: {unpinned_text(row['unpinned'])}"
    if not runner:
        return "no ci.runner in the stacks file"
    return ""


def pin(stacks_file: str, check_only: bool) -> None:
    """`invoke pin [--check]`: see :mod:`matrix.pin`."""
    from matrix.model import pin as pinning

    pinning.run(stacks_file, check_only)



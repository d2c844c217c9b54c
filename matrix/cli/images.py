"""Tasks that make and check images on a Docker engine: ``build``, ``ref``, ``engine``, ``test``."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from matrix.cli.options import (
    BUILD_METADATA,
    console,
    emit_json,
    integer,
    load,
    make_console,
    one_stack,
    pick_stacks,
    shown,
)
from matrix.errors import UserError

if TYPE_CHECKING:
    from matrix.image.plan import Plan

# --- build, ref, engine, test, check --------------------------------------------------------------

def build(stacks_file: str, stacks: Any, all_stacks: bool, registry: str | None,
          ca_bundle: str | None, as_json: bool = False,
          metadata_file: str | None = None, jobs: Any = None,
          pull_bases: bool = False, test: bool = False) -> dict[str, Any]:
    """Build the stacks; write what was built (tags, image IDs, sizes, times) as JSON metadata.
    With ``test``, each layer's tests start once the layer is built (as ``invoke test`` runs
    them), while the layers above it build; the metadata is written before the last tests end.

    Bases are made local (pulled again with ``pull_bases``) before planning: the layer tags
    hash each base's digest (matrix/image/plan.py).
    """
    from matrix.image import build as builder
    from matrix.image import ca, engine, testing
    from matrix.image.plan import plan

    workers = None if jobs is None else integer(jobs, "--jobs", minimum=1)
    matrix = load(stacks_file)
    names = pick_stacks(matrix, stacks, all_stacks)
    plan(matrix, names, engine=None)  # a stack that breaks a rule fails before the engine starts
    bundle = ca.resolve(ca_bundle)
    out = make_console(stderr=True) if as_json else console()
    client = engine.ensure()
    builder.ensure_bases(client, matrix, names, out, pull=pull_bases)
    result = plan(matrix, names, engine=client)
    started = datetime.now(timezone.utc)
    clock = time.monotonic()
    with contextlib.ExitStack() as running:
        tests = (running.enter_context(testing.LayerTestRun(client, result, names, console=out))
                 if test else None)
        results = builder.build(client, result, names, registry=registry, ca_bundle=bundle,
                                console=out, jobs=workers,
                                on_layer=tests.built if tests else None)
        metadata = build_metadata(result, names, results, started, time.monotonic() - clock)
        target = Path(metadata_file) if metadata_file else BUILD_METADATA
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(target.name + ".tmp")
        tmp.write_text(json.dumps(metadata, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        tmp.replace(target)  # never a half-written metadata file
        if as_json:
            emit_json(metadata)
        else:
            for name in names:
                print(f"{name}: {result.final_ref(name)} = {result.chains[name][-1]}")
            print(f"build metadata: {shown(target)}")
        if tests:
            each_stack(names, tests.finish)
    return metadata


def build_metadata(result: Plan, names: list[str], results: list[Any], started: datetime,
                   seconds: float) -> dict[str, Any]:
    """What a build made, per stack and per layer (as ``docker buildx bake --metadata-file``)."""
    by_ref = {r.layer.ref: r for r in results}
    layers = [{"ref": r.layer.ref, "component": r.layer.component, "version": r.layer.version,
               "status": r.status, "image_id": r.image_id, "size_bytes": r.size,
               "added_bytes": r.added, "seconds": round(r.seconds, 3), "parent": r.layer.parent}
              for r in results]
    stacks = {}
    for name in names:
        final = by_ref[result.chains[name][-1]]
        base = result.bases.get(result.matrix.stack(name).base.name)
        stacks[name] = {"image": result.final_ref(name), "ref": final.layer.ref,
                        "image_id": final.image_id, "size_bytes": final.size,
                        "layers": list(result.chains[name]),
                        "base": {"image": base.image, "digest": base.digest,
                                 "source": base.source} if base else None}
    return {"started": started.isoformat(timespec="seconds"), "seconds": round(seconds, 3),
            "stacks": stacks, "layers": layers}


def ref(stacks_file: str, stacks: Any) -> str:
    """The stack's final reference. Its first layer's tag hashes the base's content (its digest
    or local image ID, matrix/image/plan.py): a base not resolved here (no engine answers, or it
    is not local yet) would give a tag that no build ever makes, so that is refused, unless
    stacks.yaml pins the base by digest (then no engine is needed)."""
    from matrix.image.plan import plan

    matrix = load(stacks_file)
    stack = one_stack(matrix, stacks)
    result = plan(matrix, [stack])
    base = result.bases.get(matrix.stack(stack).base.name)
    if base is not None and not base.digest:
        first = ("start the engine (`invoke engine`)" if base.client_missing else
                 f"run `invoke build --stack {stack}` (it pulls or bootstraps the base)")
        raise UserError(
            f"stack {stack}: its base {base.image} is {base.source}, so its reference cannot be "
            f"known (the tags hash the base's content, matrix/image/plan.py); {first}, or pin "
            f"the base by digest in {stacks_file} (image@sha256:...)")
    final = result.chains[stack][-1]
    print(final)
    return final


def start_engine() -> None:
    from matrix.image import engine

    client = engine.ensure()
    print(f"Docker engine {client.version().get('Version', '?')} is running")


def test_stack(stacks_file: str, stacks: Any, all_stacks: bool, again: bool = False) -> None:
    """Layer tests (``invoke test``); ``again`` runs layers that passed before with the same
    inputs too."""
    from matrix.image import engine, testing
    from matrix.image.plan import plan

    matrix = load(stacks_file)
    names = pick_stacks(matrix, stacks, all_stacks)
    result = plan(matrix, names)
    client = engine.ensure()
    each_stack(names, lambda name: testing.run_stack_tests(client, result, name, console=console(),
                                                           again=again))


def each_stack(names: list[str], test: Callable[[str], object]) -> None:
    """``test`` every stack, each even when one before failed; one error naming all that did."""
    failures = []
    for name in names:
        try:
            test(name)
        except UserError as exc:
            if len(names) == 1:
                raise
            failures.append(str(exc))
    if failures:
        raise UserError("; ".join(failures))


# --- sbom -------------------------------------------------------------------------------------------

SBOM_DIR = BUILD_METADATA.parent / "sbom"


def sbom(stacks_file: str, stacks: Any, output: str | None) -> str:
    """The CycloneDX JSON of a built stack's image: to ``output`` (whole or not at all) or stdout.

    ``--output`` is checked before the engine is asked anything, as the job writers check theirs
    (matrix/cli/output.py): a folder, a device or a missing folder is a usage error, exit 2."""
    from matrix.cli import output as outputs
    from matrix.image import engine
    from matrix.image import sbom as bom
    from matrix.image.plan import plan

    matrix = load(stacks_file)
    stack = one_stack(matrix, stacks)
    target = outputs.output_path(output, f"{stack}.cdx.json") if output else None
    client = engine.ensure()
    result = plan(matrix, [stack], engine=client)
    text = bom.of_image(client, matrix, matrix.stack(stack), result.chains[stack][-1])
    if target is not None:
        outputs.write_whole(target, text, str(output))
        print(f"{stack}: CycloneDX 1.6 SBOM written to {output}")
    else:
        print(text, end="")
    return text


def write_whole(target: Path, text: str) -> None:
    """Write ``text`` to ``target`` through a sibling renamed into place."""
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.tmp")
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(target)
    except OSError as exc:
        raise UserError(f"--output {target}: cannot write it: {exc.strerror or exc}") from None


def sbom_beside(client: Any, matrix: Any, stack: str, image: str, pushed: Any,
                say: Any) -> Path:
    """After a push: the SBOM as a file under .mnp/sbom/, and beside the image in the registry
    (``<repo>:sha256-<digest>.sbom``) where the registry takes it; the file's path."""
    from matrix.deploy import publish
    from matrix.image import sbom as bom

    text = bom.of_image(client, matrix, matrix.stack(stack), image)
    digest = (pushed.image_digest_uri or "@unknown").split("@", 1)[1]
    target = SBOM_DIR / f"{stack}-{digest.replace(':', '-')}.cdx.json"
    write_whole(target, text)
    say(f"SBOM (CycloneDX 1.6): {shown(target)}")
    try:
        say(f"SBOM pushed beside the image: {publish.push_sbom(client, pushed, text, log=say)}")
    except UserError as exc:
        say(f"SBOM not pushed ({exc}); it is in {shown(target)}")
    return target

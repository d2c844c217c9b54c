"""Build benchmark: cold, no-change and top-layer rebuilds of cpu-tcp; cold build of the CUDA TCP
stack and what it shares; shared layers (one layer at a time, then independent layers in
parallel) vs one monolithic Dockerfile per stack over every stack that builds here; final size
vs a naive single Dockerfile.

    python bench/build.py            # prints a table of figures and ratios (about 40 minutes)
    python bench/build.py --parts all --repository mnp-bench-x   # only the parallel comparison

``--repository`` builds under another repository name, so the run neither removes nor reuses
the images other builds on this engine keep under the project's own tags.

Everything runs on this machine's engine in one run, so the ratios compare like with like. The
baselines are built with no cache (each stack in isolation, as hand-written per-combination
Dockerfiles are), and our own cold build also bypasses the engine's cache.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import shutil
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from rich.console import Console  # noqa: E402

from matrix.image import build, ca, engine, schedule  # noqa: E402
from matrix.image.plan import Layer, plan  # noqa: E402
from matrix.model.loader import load_matrix  # noqa: E402
from matrix.model.settings import IMAGES  # noqa: E402

QUIET = Console(file=io.StringIO(), width=200)

# The same software the way a hand-written Dockerfile usually installs it: recommends on, apt
# lists and pip cache kept. It trusts the proxy CA the same way our layers do (a fair network).
NAIVE = """FROM debian:bookworm
RUN apt-get update && apt-get install -y openssh-server openssh-client libfabric-bin openmpi-bin \\
    python3 python3-pip python3-mpi4py python3-torch python3-pydantic python3-tqdm \\
    python3-psutil python3-cpuinfo python3-packaging python3-setuptools python3-wheel ninja-build
SHELL ["/bin/bash", "-c"]
ARG MNP_CA_URL
RUN {ca}; pip install --break-system-packages --no-build-isolation deepspeed==0.14.4 \\
    hjson==3.1.0 nvidia-ml-py==12.535.161
COPY entrypoint/ /opt/mnp/lib/entrypoint/
COPY mnp-entrypoint /usr/local/bin/mnp-entrypoint
ENTRYPOINT ["/usr/local/bin/mnp-entrypoint"]
"""


def remove_chain(client, refs: list[str]) -> None:
    """Untag the layer images (newest first) so the next build starts cold."""
    from docker.errors import APIError, ImageNotFound

    for ref in reversed(refs):
        with contextlib.suppress(ImageNotFound, APIError):
            client.images.remove(ref)


def timed_build(client, result, stacks, bundle, no_cache=False, jobs=1) -> tuple[float, list]:
    started = time.monotonic()
    out = build.build(client, result, stacks, ca_bundle=bundle, console=QUIET, no_cache=no_cache,
                      jobs=jobs)
    return time.monotonic() - started, out


def monolithic(layers: list[Layer]) -> tuple[str, dict[str, bytes]]:
    """One Dockerfile doing what the stack's layers do, in one build."""
    lines, files = [], {}
    for index, layer in enumerate(layers):
        for line in layer.dockerfile.splitlines():
            if line.startswith("#"):
                continue
            if line.startswith("FROM ") and index:
                continue
            lines.append(line)
        for item in layer.context:
            files[item.path] = item.source.read_bytes()
    return "\n".join(lines) + "\n", files


def build_raw(client, dockerfile: str, files: dict[str, bytes], tag: str, ca_url: str) -> float:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, data in {"Dockerfile": dockerfile.encode(), **files}.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o755
            tar.addfile(info, io.BytesIO(data))
    buffer.seek(0)
    started = time.monotonic()
    for chunk in client.api.build(fileobj=buffer, custom_context=True, tag=tag, rm=True,
                                  forcerm=True, nocache=True, network_mode="host", decode=True,
                                  buildargs={"MNP_CA_URL": ca_url} if ca_url else {}):
        if "error" in chunk:
            raise SystemExit(f"baseline build {tag} failed: {chunk['error']}")
    return time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stacks", default=str(ROOT / "stacks.yaml"))
    parser.add_argument("--repository", help="build under this repository (default: the "
                        "stacks file's); its images are removed at the end")
    parser.add_argument("--jobs", type=int, default=schedule.default_jobs(),
                        help="layers at once for the parallel row (default: %(default)s here)")
    parser.add_argument("--only", help="comma list: compare these buildable stacks only "
                        "(default: every stack that builds here)")
    parser.add_argument("--parts", default="rebuild,gpu,all,size",
                        help="comma list of: rebuild (cold/no-change/top), gpu (cold CUDA TCP "
                             "stack, shared layers), all (shared vs monolithic), size (vs naive)")
    args = parser.parse_args()
    parts = set(args.parts.split(","))
    client = engine.ensure()
    matrix = load_matrix(Path(args.stacks))
    if args.repository:
        matrix = dataclasses.replace(matrix, repository=args.repository)
    buildable = [n for n, s in matrix.stacks.items() if buildable_here(s)]
    if args.only:
        buildable = [n for n in buildable if n in args.only.split(",")]
    bundle = ca.resolve(None)
    rows = []

    def row(name, seconds, baseline=None, note=""):
        ratio = f"{seconds / baseline:.3f}" if baseline else ""
        rows.append((name, f"{seconds:.1f}", ratio, note))
        print(f"{name}: {seconds:.1f} s {('ratio ' + ratio) if ratio else ''} {note}", flush=True)

    if "rebuild" in parts:
        rebuilds(client, matrix, bundle, row)
    if "gpu" in parts:
        cuda_tcp(client, matrix, bundle, row)
    all_plan = plan(matrix, buildable)
    if "all" in parts:
        shared_vs_monolithic(client, all_plan, buildable, bundle, row, args.jobs)
    if "size" in parts:
        rows.append(size_vs_naive(client, all_plan, bundle))

    print("\n| measurement | seconds (or MB) | ratio to baseline | note |\n|---|---|---|---|")
    for name, value, ratio, note in rows:
        print(f"| {name} | {value} | {ratio} | {note} |")
    if args.repository:
        from tests.build_project import remove_repository

        remove_repository(client, args.repository)


def buildable_here(stack) -> bool:
    """Stacks this machine builds from nothing: a bootstrapped base and no layer that downloads
    from GitHub or AWS (unreachable here; pip and Debian are reachable)."""
    return bool(stack.base.bootstrap) and not any(cv.spec.get("source") == "download"
                                                  for cv in stack.layers)


def shared_layers(result, one: str, other: str) -> int:
    """Images two stacks' chains have in common (each built once)."""
    return len(set(result.chains[one]) & set(result.chains[other]))


def cuda_tcp(client, matrix, bundle, row, stack="cuda13.2-tcp", efa="cuda13.2-efa") -> None:
    """The CUDA TCP stack cold (layers it shares with cpu-tcp kept, as on a machine that built
    the default stack), and what it shares with cpu-tcp and its EFA sibling."""
    result = plan(matrix, ["cpu-tcp", stack, efa])
    mine = [ref for ref in result.chains[stack] if ref not in result.chains["cpu-tcp"]]
    build.build(client, result, ["cpu-tcp"], ca_bundle=bundle, console=QUIET)
    remove_chain(client, mine)
    seconds, out = timed_build(client, result, [stack], bundle, no_cache=True)
    row(f"{stack} cold build", seconds, None,
        f"{sum(r.status == 'built' for r in out)} layers built; shares "
        f"{shared_layers(result, stack, 'cpu-tcp')} with cpu-tcp and "
        f"{shared_layers(result, stack, efa)} of {len(result.chains[efa])} with {efa}")


def rebuilds(client, matrix, bundle, row) -> None:
    """cpu-tcp cold, then with nothing changed, then with its top layer changed."""
    main_plan = plan(matrix, ["cpu-tcp"])
    remove_chain(client, main_plan.chains["cpu-tcp"])
    cold, _ = timed_build(client, main_plan, ["cpu-tcp"], bundle, no_cache=True)
    row("cpu-tcp cold build", cold)
    warm, out = timed_build(client, main_plan, ["cpu-tcp"], bundle)
    row("cpu-tcp no-change rebuild", warm, cold,
        f"{sum(r.status == 'built' for r in out)} layers built")
    with tempfile.TemporaryDirectory() as tmp:
        images = Path(tmp) / "images"
        shutil.copytree(IMAGES, images, ignore=shutil.ignore_patterns("generated"))
        top = images / "entrypoint" / "Dockerfile.j2"
        top.write_text(top.read_text() + "RUN echo bench > /etc/mnp-bench\n")
        changed = plan(matrix, ["cpu-tcp"], images=images)
        seconds, out = timed_build(client, changed, ["cpu-tcp"], bundle)
        row("cpu-tcp top-layer change", seconds, cold,
            f"{sum(r.status == 'built' for r in out)} layers built")
        remove_chain(client, [changed.chains["cpu-tcp"][-1], changed.chains["cpu-tcp"][-2]])


def shared_vs_monolithic(client, all_plan, buildable, bundle, row, jobs: int) -> None:
    """--all (shared layers, built once) one layer at a time and ``jobs`` at once, vs one
    monolithic Dockerfile per stack built in isolation; all three cold, in one run."""
    refs = [layer.ref for layer in all_plan.order(buildable)]
    remove_chain(client, refs)
    sequential, _ = timed_build(client, all_plan, buildable, bundle, no_cache=True, jobs=1)
    remove_chain(client, refs)
    parallel, results = timed_build(client, all_plan, buildable, bundle, no_cache=True, jobs=jobs)
    with ca.serve(bundle) as ca_url:
        alone = {}
        for stack in buildable:
            dockerfile, files = monolithic(all_plan.chain(stack)[:-1])
            alone[stack] = build_raw(client, dockerfile, files, f"mnp-bench-mono:{stack}", ca_url)
        mono = sum(alone.values())
        row(f"monolithic, each stack alone ({', '.join(buildable)})", mono, None,
            "; ".join(f"{stack} {seconds:.0f} s" for stack, seconds in alone.items()))
        longest = max(alone, key=alone.get)
        # A stack's layers form one chain (each FROM the one before): no scheduler builds that
        # chain faster than the stack's own build, so its share of the baseline is a floor.
        row(f"floor: the longest stack alone ({longest}, monolithic)", alone[longest], mono,
            "no layer scheduler can go below this on this matrix")
        note = (f"{len(all_plan.order(buildable))} layers for "
                f"{sum(len(c) for c in all_plan.chains.values())} stack layers")
        row(f"invoke build --all --jobs 1 ({len(buildable)} stacks, shared layers)", sequential,
            mono, note)
        seconds = {r.layer.ref: r.seconds for r in results}
        chain, path = max(((stack, sum(seconds[ref] for ref in all_plan.chains[stack]))
                           for stack in buildable), key=lambda item: item[1])
        row(f"invoke build --all --jobs {jobs} (independent layers in parallel)", parallel, mono,
            f"{note}; {parallel / sequential:.3f} of --jobs 1; its longest chain ({chain}'s "
            f"layers) took {path:.0f} s of it")
    for stack in buildable:
        remove_chain(client, [f"mnp-bench-mono:{stack}"])


def size_vs_naive(client, all_plan, bundle) -> tuple[str, str, str, str]:
    """Final cpu-tcp size vs the same software from one naive Dockerfile."""
    from matrix.image.render import environment

    ca_snippet = environment().from_string(
        '{% import "_macros.j2" as m %}{{ m.ca_begin() }}').render()
    build.build(client, all_plan, ["cpu-tcp"], ca_bundle=bundle, console=QUIET)
    with ca.serve(bundle) as ca_url:
        entry = next(x for x in all_plan.chain("cpu-tcp") if x.component == "entrypoint")
        files = {item.path: item.source.read_bytes() for item in entry.context}
        naive_file = NAIVE.replace("{ca}", ca_snippet)
        naive_time = build_raw(client, naive_file, files, "mnp-bench-naive:cpu-tcp", ca_url)
    ours = client.images.get(all_plan.chains["cpu-tcp"][-1]).attrs["Size"]
    naive = client.images.get("mnp-bench-naive:cpu-tcp").attrs["Size"]
    remove_chain(client, ["mnp-bench-naive:cpu-tcp"])
    print(f"cpu-tcp size: {ours / 1e6:.0f} MB vs naive {naive / 1e6:.0f} MB", flush=True)
    return ("cpu-tcp image size (MB)", f"{ours / 1e6:.0f}", f"{ours / naive:.3f}",
            f"naive single Dockerfile: {naive / 1e6:.0f} MB, built in {naive_time:.0f} s")


if __name__ == "__main__":
    main()

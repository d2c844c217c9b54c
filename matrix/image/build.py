"""Build a plan's layers on a Docker engine, parents first, under content-addressed tags.

A layer whose tag already exists locally is not rebuilt; one found in the configured registry is
pulled instead. Independent layers build side by side (:mod:`matrix.image.schedule`, ``--jobs``),
each under a per-engine lock that keeps concurrent builds from crossing (:mod:`matrix.image.lock`).
Each build streams through the Engine API (docker SDK, classic builder) with a status per step,
its full log saved under ``.mnp/logs/``; a failure shows the log's tail, starts nothing more and
ends the run with a summary and a non-zero exit. An engine that fails rather than answers
(connection lost mid-stream, refused, a container it cannot start) ends the run, once the layers
already running have stopped, with one line naming the engine, the layer and its log
(:data:`engine.ENGINE_FAULTS`); the container of a build step such a fault cut off is removed
once the engine answers again, or by the next build (:mod:`matrix.image.cutoff`).
"""

from __future__ import annotations

import io
import re
import shlex
import tarfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker
from docker.errors import APIError, ImageNotFound
from rich.console import Console
from rich.table import Table

from matrix.errors import UserError
from matrix.image import bootstrap, budget, ca, cutoff, engine, lock, proxy, schedule
from matrix.image import registry as reg
from matrix.image.plan import LABEL_PREFIX, PARENT_LABEL, Layer, Plan, resolve_bases
from matrix.image.progress import LayerResult, Reporter, mb
from matrix.model.settings import ROOT

STATE = ROOT / ".mnp"
STEP = re.compile(r"^Step (\d+)/(\d+) : (.*)")
TAIL_LINES = 25


def build(client: docker.DockerClient, plan: Plan, stacks: list[str], *,
          registry: str | None = None, ca_bundle: Path | None = None,
          console: Console | None = None, state: Path = STATE,
          no_cache: bool = False, jobs: int | None = None,
          retry: reg.Retry | None = None,
          on_layer: Callable[[Layer], None] | None = None) -> list[LayerResult]:
    """Build what the stacks need, up to ``jobs`` layers at once; one result per layer.

    ``on_layer`` is called with each layer once its image is here (built, found by its tag or
    pulled), in the order they come, on the calling thread: ``build --test`` starts the layer's
    tests then (:class:`matrix.image.testing.LayerTestRun`).

    With a ``registry``, its answer for the first layer is read before anything is built, so a
    registry that refuses our credentials ends the run (one line, :mod:`registry`) with nothing
    built; ``retry`` is the backoff while it is busy. Raises :class:`UserError` after a failure
    (once the layers already running are done).
    """
    console = console or Console(highlight=False)
    key = lock.engine_key(client)
    cutoff.sweep(client, state, key, console.print)
    layers = plan.order(stacks)
    if registry and layers:
        reg.has_manifest(client, remote_ref(layers[0], registry), registry, retry=retry,
                         log=console.print)
    ensure_bases(client, plan.matrix, stacks, console)
    _check_bases(client, plan, stacks)
    reporter = Reporter(console, layers)
    with ca.serve(ca_bundle) as ca_url:
        job = _Job(client, registry, ca_url, proxy.build_args(), reporter, state, no_cache, key,
                   retry)

        def done(result: LayerResult) -> None:
            reporter.done(result)
            if result.status == "failed" and result.log:
                _show_tail(reporter, result.log)
            elif on_layer is not None and result.status in ("built", "cached", "pulled"):
                on_layer(result.layer)

        try:
            results = schedule.run(layers, job.layer, jobs or schedule.default_jobs(), done)
        finally:
            reporter.stop()
    ordered = [results[layer.ref] for layer in layers]
    summary(console, ordered)
    failed = [r for r in ordered if r.status == "failed"]
    if failed:
        raise UserError(f"layer {failed[0].layer.name} failed to build; full log: {failed[0].log}")
    for stack in stacks:
        final = plan.layers[plan.chains[stack][-1]]
        repository, tag = plan.final_ref(stack).rsplit(":", 1)
        try:
            # A layer found in the registry by its tag was not built here: its config too
            # must say the stack's platform before the stack's name points at it.
            bootstrap.check_architecture(client, final.ref, plan.matrix.stack(stack).platform,
                                         f"the final image of stack {stack}:")
            client.api.tag(final.ref, repository, tag)
        except engine.ENGINE_FAULTS as exc:
            raise engine.fault(client, exc, f"tagging {plan.final_ref(stack)}") from None
        _check_budget(plan, stack, results[final.ref])
    try:
        budget.check(client, plan, stacks)
    except engine.ENGINE_FAULTS as exc:
        raise engine.fault(client, exc, "reading the layers' history") from None
    return ordered


def ensure_bases(client: docker.DockerClient, matrix: Any, stacks: list[str],
                 console: Console, pull: bool = False) -> None:
    """Make every base the stacks need local (pulled or bootstrapped); ``pull`` pulls those a
    registry serves again, so a base re-pushed under the same tag is seen."""
    # Per base and platform: the engine does not enforce a build's platform (20.10's classic
    # builder makes a linux/arm64 child of an amd64 parent without a word), so each base's
    # image config must say the platform of every stack built on it.
    needs = {(matrix.stack(s).base.name, matrix.stack(s).platform): matrix.stack(s)
             for s in stacks}
    done: set[str] = set()
    for (name, platform), stack in needs.items():
        base = stack.base
        try:
            if name not in done:
                how = bootstrap.ensure_base(client, base, log=console.print, pull=pull,
                                            platform=platform)
                console.print(f"base {base.image}: {how}")
                done.add(name)
            bootstrap.check_architecture(client, base.image, platform,
                                         f"base {name!r} of stack {stack.name}:")
        except engine.ENGINE_FAULTS as exc:
            raise engine.fault(client, exc, f"checking base image {base.image}") from None


def _check_bases(client: docker.DockerClient, plan: Plan, stacks: list[str]) -> None:
    """The plan's tags hash each base's digest: a base that is not the one planned (made or
    pulled since) would put layers under tags that do not name their content."""
    now = resolve_bases(plan.matrix, stacks, client)
    for name, base in now.items():
        planned = plan.bases.get(name)
        if planned is not None and planned.identity != base.identity:
            raise UserError(f"base {base.image} is {base.digest or 'unresolved'} now, not "
                            f"{planned.digest or 'unresolved'} as planned; plan again (invoke "
                            "build does: run it again)")


@dataclass
class _Job:
    """What every layer's build needs; :meth:`layer` runs on a scheduler worker thread."""

    client: docker.DockerClient
    registry: str | None
    ca_url: str
    proxies: dict[str, str]
    reporter: Reporter
    state: Path
    no_cache: bool
    engine_key: str
    retry: reg.Retry | None = None

    def layer(self, layer: Layer, parent: LayerResult | None) -> LayerResult:
        """Reuse, pull or build one layer under its lock; engine faults become one line, after
        the container of a build step they cut off is removed (or recorded, :mod:`cutoff`)."""
        steps = cutoff.Steps(f"layer {layer.name} ({layer.ref})")
        try:
            with lock.layer(self.engine_key, layer.ref, layer.parent, on_wait=lambda: self.reporter.say(
                    f"{self.reporter.prefix(layer)}: waiting for another build of it (or of its "
                    "parent) on this engine")):
                return self._unlocked(layer, parent, steps)
        except engine.ENGINE_FAULTS as exc:
            left = cutoff.after_fault(self.client, steps, self.state, self.engine_key, exc)
            raise engine.fault(self.client, exc, f"building layer {layer.name} ({layer.ref})",
                               f"log: {log_path(self.state, layer)}{left}") from None

    def _unlocked(self, layer: Layer, parent: LayerResult | None,
                  steps: cutoff.Steps) -> LayerResult:
        if _trusted(self.client, layer, self.reporter):
            result = LayerResult(layer, "cached")
        elif self.registry and _pull(self.client, layer, self.registry, self.retry,
                                     self.reporter.say):
            result = LayerResult(layer, "pulled")
        else:
            self.reporter.start(layer)
            result = _one(self, layer, steps)
        _measure(self.client, result, parent)
        return result


def log_path(state: Path, layer: Layer) -> Path:
    """Where the build log of ``layer`` goes."""
    return state / "logs" / f"{layer.tag}.log"


def _one(job: _Job, layer: Layer, steps: cutoff.Steps) -> LayerResult:
    log = log_path(job.state, layer)
    try:
        log.parent.mkdir(parents=True, exist_ok=True)
        log.open("w", encoding="utf-8").close()
    except OSError as exc:
        raise UserError(f"layer {layer.name}: cannot write its build log {log}: "
                        f"{exc.strerror or exc} (move away what is there)") from None
    started = time.monotonic()
    ok = _stream_build(job, layer, log, steps)
    return LayerResult(layer, "built" if ok else "failed", time.monotonic() - started, log=log)


def _stream_build(job: _Job, layer: Layer, log_path: Path, steps: cutoff.Steps) -> bool:
    # Proxies first: a layer's own build arguments win over a same-named proxy variable.
    args = {**job.proxies, **layer.build_args}
    if job.ca_url:
        args["MNP_CA_URL"] = job.ca_url
    before = engine.identity(job.client)
    # The parent it is built on, by image ID: a registry copy of this layer is used only when
    # its parent is the local one (_pull); the engine adds it as a last LABEL step, so the
    # steps before it keep their cache.
    labels = {PARENT_LABEL: job.client.images.get(layer.parent).id}
    with log_path.open("w", encoding="utf-8") as log:
        log.write(f"# {layer.ref}\n# FROM {layer.parent}\n")
        try:
            for chunk in job.client.api.build(fileobj=context_tar(layer), custom_context=True,
                                              tag=layer.ref, rm=True, forcerm=True, pull=False,
                                              network_mode="host", buildargs=args, decode=True,
                                              nocache=job.no_cache, labels=labels):
                if "stream" in chunk:
                    text = chunk["stream"]
                    log.write(text)
                    steps.see(text)
                    match = STEP.match(text.strip())
                    if match:
                        job.reporter.step(layer, int(match[1]), int(match[2]), match[3])
                elif "error" in chunk:
                    log.write(f"\nERROR: {chunk['error']}\n")
                    _blame_the_engine(job.client, chunk["error"], before)
                    return False
        except APIError as exc:
            log.write(f"\nERROR: {exc.explanation or exc}\n")
            return False
        except engine.ENGINE_FAULTS as exc:
            log.write(f"\nERROR: the engine failed mid-build: {type(exc).__name__}: {exc}\n")
            if not isinstance(exc, engine.EngineGone) and engine.went_away(job.client, before):
                # A killed dockerd just drops the stream; say that it went, not only how.
                raise engine.EngineGone("it stopped or restarted mid-build (the build's stream "
                                        f"broke: {type(exc).__name__})") from None
            raise
    return _exists(job.client, layer.ref)


def _blame_the_engine(client: docker.DockerClient, error: str,
                      before: tuple[int, int] | None) -> None:
    """A build error is the engine's doing when the engine went away with it (a stopping dockerd
    kills the step's container or loses its network store first): raise that, one line naming
    the engine, instead of calling the layer broken. Costs a few seconds per failed layer."""
    if engine.went_away(client, before):
        first = error.strip().splitlines()[0][:160] if error.strip() else "no message"
        raise engine.EngineGone(f"it stopped or restarted mid-build (the build said: {first})")


def context_tar(layer: Layer) -> io.BytesIO:
    """The build context: the rendered Dockerfile plus the layer's files, deterministic tar."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        _add(tar, "Dockerfile", layer.dockerfile.encode(), 0o644)
        for item in layer.context:
            _add(tar, item.path, item.source.read_bytes(), 0o755 if item.executable else 0o644)
    buffer.seek(0)
    return buffer


def _add(tar: tarfile.TarFile, name: str, data: bytes, mode: int) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = len(data), mode, 0
    tar.addfile(info, io.BytesIO(data))


def _exists(client: docker.DockerClient, ref: str) -> bool:
    try:
        client.images.get(ref)
        return True
    except ImageNotFound:
        return False


def _trusted(client: docker.DockerClient, layer: Layer, reporter: Reporter) -> bool:
    """Whether the image under the layer's content tag may stand for the layer.

    A tag can be re-pointed by hand, a script or another tool; the tag alone proves nothing.
    The image must carry exactly the project's labels (``io.github.mnp-stacks.*``) its parent
    has plus those its Dockerfile sets, and its filesystem must start with its parent's layers.
    When it does not, the layer is rebuilt (which re-points the tag) and a line says why.
    """
    try:
        image = client.images.get(layer.ref)
    except ImageNotFound:
        return False
    why = _mismatch(client, layer, image)
    if why:
        reporter.say(f"{layer.name}: the image tagged {layer.ref} {why}; rebuilding it")
    return not why


def _mismatch(client: docker.DockerClient, layer: Layer, image: Any) -> str:
    """What makes ``image`` not the one ``layer``'s Dockerfile builds ("" when nothing)."""
    parent = client.images.get(layer.parent)
    expected = {**_ours(parent.labels), **_ours(dockerfile_labels(layer.dockerfile))}
    expected.pop(PARENT_LABEL, None)
    actual = _ours(image.labels)
    actual.pop(PARENT_LABEL, None)
    for key in sorted(set(expected) | set(actual)):
        if expected.get(key) != actual.get(key):
            return (f"has label {key}={actual.get(key)!r} where its Dockerfile gives "
                    f"{expected.get(key)!r}")
    recorded = (image.labels or {}).get(PARENT_LABEL)
    if recorded != parent.id:
        return (f"records parent {recorded or 'none'} ({PARENT_LABEL}), not {parent.id}, the "
                f"image {layer.parent} names here")
    ours = (image.attrs.get("RootFS") or {}).get("Layers") or []
    theirs = (parent.attrs.get("RootFS") or {}).get("Layers") or []
    if ours[:len(theirs)] != theirs:
        return f"is not built on its parent {layer.parent} (its layers do not start with the parent's)"
    return ""


def _ours(labels: dict[str, str] | None) -> dict[str, str]:
    return {k: v for k, v in (labels or {}).items() if k.startswith(f"{LABEL_PREFIX}.")}


def dockerfile_labels(dockerfile: str) -> dict[str, str]:
    """The labels a Dockerfile's LABEL instructions set (``key=value`` pairs, shell-quoted)."""
    labels: dict[str, str] = {}
    for instruction in re.sub(r"\\\n", " ", dockerfile).splitlines():
        words = instruction.strip().split(None, 1)
        if len(words) == 2 and words[0].upper() == "LABEL":
            for pair in shlex.split(words[1]):
                key, _, value = pair.partition("=")
                labels[key] = value
    return labels


def remote_ref(layer: Layer, registry: str) -> str:
    return f"{registry.rstrip('/')}/{layer.ref}"


def _pull(client: docker.DockerClient, layer: Layer, registry: str, retry: reg.Retry | None,
          log) -> bool:
    """Pull the layer from the registry when it is there, and tag it under the local name.

    Absent (404) means build it; refused credentials or a registry busy through every retry
    is one :class:`UserError` (:mod:`registry`), never a silent rebuild.
    """
    remote = remote_ref(layer, registry)
    if not reg.has_manifest(client, remote, registry, retry=retry, log=log):
        return False
    repository, tag = remote.rsplit(":", 1)
    image = reg.call(client, lambda: client.images.pull(repository, tag=tag), registry,
                     f"pulling {remote}", retry=retry, log=log)
    if image is None:  # deleted between the two calls
        return False
    parent = client.images.get(layer.parent).id
    recorded = (image.labels or {}).get(PARENT_LABEL)
    if recorded != parent:
        log(f"{layer.name}: {remote} was built on parent {recorded or '(not recorded)'}, not on "
            f"this engine's {layer.parent} ({parent}); building it here")
        return False
    local_repo, local_tag = layer.ref.rsplit(":", 1)
    image.tag(local_repo, local_tag)
    return True


def _measure(client: docker.DockerClient, result: LayerResult,
             parent: LayerResult | None) -> None:
    if result.status in ("failed", "skipped"):
        return
    image = client.images.get(result.layer.ref)
    result.image_id = image.id
    result.size = image.attrs.get("Size", 0)
    if parent is not None:
        result.added = max(result.size - parent.size, 0)
    else:
        try:
            result.added = result.size - client.images.get(result.layer.parent).attrs["Size"]
        except ImageNotFound:
            result.added = result.size


def _show_tail(reporter: Reporter, log: Path) -> None:
    lines = log.read_text(encoding="utf-8", errors="replace").splitlines()[-TAIL_LINES:]
    reporter.say("\n".join([f"--- last {len(lines)} lines of {log} ---", *lines, "---"]))


def summary(console: Console, results: list[LayerResult]) -> None:
    table = Table(title="build summary")
    for column in ("layer", "tag", "status", "time", "size", "added"):
        table.add_column(column, justify="right" if column in ("time", "size", "added") else "left")
    for r in results:
        table.add_row(r.layer.name, r.layer.tag, r.status,
                      f"{r.seconds:.0f} s" if r.status in ("built", "failed") else "-",
                      f"{mb(r.size)} MB" if r.size else "-",
                      f"{mb(r.added)} MB" if r.size else "-")
    console.print(table)
    built = sum(r.status == "built" for r in results)
    console.print(f"{built} layer(s) built, {sum(r.status == 'cached' for r in results)} cached, "
                  f"{sum(r.status == 'pulled' for r in results)} pulled")


def _check_budget(plan: Plan, stack: str, final: LayerResult) -> None:
    budget = plan.matrix.stack(stack).size_budget_mb
    if budget and final.size > budget * 1_000_000:
        raise UserError(f"{plan.matrix.stack(stack).where}: stack {stack}: image is "
                        f"{mb(final.size)} MB, over its size_budget_mb of {budget}")




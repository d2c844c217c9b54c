"""Run each layer's testinfra tests against a container of that layer's image.

For every layer of a stack, ``images/<component>/test_*.py`` runs under pytest with testinfra's
docker backend against a fresh container of the layer's own image (so a layer is tested before
anything above it can hide a problem); the stack-level tests in ``images/_stack/`` run against the
final image. Results are reported per layer. A layer that has test files but where no test
passed (all skipped, or none collected) fails the run like a failing test: a layer whose tests
cannot run against its image is not tested. Every run is recorded by the final image's ID
(:mod:`matrix.image.testrecord`): ``started`` before the first test, then ``passed`` or
``failed``, and ``invoke push`` requires the latest run of that image to have passed.

Layers are tested side by side (``LAYER_JOBS`` at a time): a layer's run mostly waits on its
container (the image's Python importing torch, DeepSpeed compiling an op just in time), and the
slowest layer alone then sets the run's time; under ``build --test`` each layer's run starts once
the build has made it (:class:`LayerTestRun`). A layer whose tests passed before with exactly the
same inputs (the layer's image, its test files, the code they import: ``testrecord.layer_key``)
is reported from that record, marked ``cached``, unless ``again`` is asked for.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import threading
import time
import xml.etree.ElementTree as ET
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import docker
from docker.errors import ImageNotFound
from rich.console import Console
from rich.table import Table

from matrix.errors import UserError
from matrix.image import testrecord
from matrix.image.engine import ENGINE_FAULTS, fault
from matrix.image.plan import Layer, Plan
from matrix.model.settings import IMAGES, ROOT


@dataclass
class LayerTests:
    layer: Layer
    passed: int = 0
    failed: int = 0
    skipped: int = 0
    seconds: float = 0.0
    note: str = ""
    output: str = ""  # the layer run's pytest output when it did not pass

    @property
    def ran_nothing(self) -> bool:
        """It has test files, yet no test passed or failed (all skipped, or none collected)."""
        return self.note != NO_TESTS and self.passed == 0 and self.failed == 0

    @property
    def ok(self) -> bool:
        return self.failed == 0 and not self.ran_nothing

    def why_not_ok(self) -> str:
        if self.failed:
            return f"{self.layer.name} ({self.failed} failed)"
        if self.skipped:
            return f"{self.layer.name} (all {self.skipped} tests skipped)"
        return f"{self.layer.name} (no test collected)"


NO_TESTS = "no tests"  # a layer without test files (a component that has none)
CACHED = "cached"  # reported from a pass with the same inputs (testrecord.layer_key)
# Layer runs side by side. Measured on the project's 2-core machine (docs/measurements.md):
# cpu-tcp's ten layers take as long as its DeepSpeed layer alone.
LAYER_JOBS = 4
TEST_TOOLS = ("pytest", "pytest-testinfra", "docker")


def key_inputs(images: Path) -> list[Path]:
    """The files every layer's test run depends on besides its own test files: their conftest,
    the project code they import (``matrix.model`` with its data, ``entrypoint``) and the
    project's stacks file, which they load; a test that imports more must add it here. This
    runner is not among them: what it reports of a run is tested on throwaway stacks with a
    cache of their own (tests/test_layer_tests_ran.py), never from this one."""
    code = [*(ROOT / "matrix" / "model").rglob("*.py"), *(ROOT / "matrix" / "model").rglob("*.yaml"),
            *(ROOT / "entrypoint").rglob("*.py"), ROOT / "stacks.yaml"]
    return [images / "conftest.py", *(path for path in code if path.is_file())]


def tool_versions(client: docker.DockerClient) -> dict[str, str]:
    versions = {"python": sys.version, "engine": str(client.version().get("Version", ""))}
    for name in TEST_TOOLS:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = ""
    return versions


def test_files(component: str, images: Path = IMAGES) -> list[Path]:
    folder = "_stack" if component == "_stack" else component
    return sorted((images / folder).glob("test_*.py"))


def layer_description(plan: Plan, stack: str, layer: Layer) -> dict:
    """What a layer test knows about its layer (the ``layer`` fixture in images/conftest.py)."""
    s = plan.matrix.stack(stack)
    spec = next((cv.spec for cv in s.layers if cv.component == layer.component), {})
    return {"component": layer.component, "version": layer.version, "spec": spec,
            "stack": stack, "fabric": s.fabric, "image": layer.ref, "versions": s.versions(),
            "components": [cv.component for cv in s.layers]}


def run_stack_tests(client: docker.DockerClient, plan: Plan, stack: str,
                    console: Console | None = None,
                    state: Path = testrecord.DEFAULT_STATE_DIR,
                    images: Path = IMAGES, again: bool = False,
                    cache: Path = testrecord.LAYER_CACHE_DIR) -> list[LayerTests]:
    """Test every layer of ``stack``; raises :class:`UserError` when any test fails.

    The run is recorded for the final image as ``started`` first (so an interrupted run also
    withdraws an earlier pass), then ``passed`` or ``failed``. Layer passes are kept in and
    read from ``cache``; with ``again``, layers whose tests passed with the same inputs run too.
    """
    chain = plan.chain(stack)
    for layer in chain:
        try:
            client.images.get(layer.ref)
        except ImageNotFound:
            raise UserError(f"{layer.ref} is not built; run `invoke build --stack {stack}` "
                            "first") from None
    with LayerTestRun(client, plan, [stack], console, state, images, again, cache) as run:
        run.final_exists(stack, client.images.get(chain[-1].ref).id)  # before any test runs
        for layer in chain:
            run.built(layer)
        return run.finish(stack)


class LayerTestRun:
    """The layer tests of one or more stacks, ``LAYER_JOBS`` layers at a time, each layer's run
    started as soon as :meth:`built` says its image exists.

    ``invoke test`` says so of every layer at once; ``invoke build --test`` says so as the build
    makes (or finds) each layer, so that a layer's tests run while the layers above it build:
    the build is one chain of layers that mostly waits on downloads and single compilers, and a
    stack's tests took as long again after it (docs/measurements.md). A stack's run is recorded
    ``started`` once its final image exists (its ID is what the record is kept under, and the
    final layer is the last one made), then ``passed`` or ``failed`` by :meth:`finish`. Leaving
    the ``with`` block on an error cancels the layers not yet started and waits for the running
    ones (each a pytest process with its container, removed at its end).
    """

    def __init__(self, client: docker.DockerClient, plan: Plan, stacks: list[str],
                 console: Console | None = None, state: Path = testrecord.DEFAULT_STATE_DIR,
                 images: Path = IMAGES, again: bool = False,
                 cache: Path = testrecord.LAYER_CACHE_DIR) -> None:
        self.client, self.plan, self.images, self.again, self.cache = (client, plan, images,
                                                                       again, cache)
        self.state = state
        self.console = console or Console(highlight=False)
        self.chains = {stack: plan.chain(stack) for stack in stacks}
        self.shared, self.tools = key_inputs(images), tool_versions(client)
        self.results: dict[str, dict[int, LayerTests]] = {stack: {} for stack in stacks}
        self.running: dict[str, list[Future]] = {stack: [] for stack in stacks}
        self.final_ids: dict[str, str] = {}
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=LAYER_JOBS, thread_name_prefix="layer test")

    def __enter__(self) -> LayerTestRun:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)

    def built(self, layer: Layer) -> None:
        """``layer``'s image exists: start its tests in every stack whose chain holds it (or
        report them from an earlier pass with the same inputs)."""
        try:
            image_id = self.client.images.get(layer.ref).id
        except ENGINE_FAULTS as exc:
            raise fault(self.client, exc, f"reading {layer.ref} to test it") from None
        for stack, chain in self.chains.items():
            if layer not in chain:
                continue
            if layer.ref == chain[-1].ref:
                self.final_exists(stack, image_id)
            self._start(stack, chain.index(layer) + 1, layer, image_id)

    def final_exists(self, stack: str, image_id: str) -> None:
        """``stack``'s final image is ``image_id``: its run is recorded as started (once)."""
        if self.final_ids.get(stack) != image_id:
            self.final_ids[stack] = image_id
            testrecord.record_start(image_id, stack, self.state)

    def _start(self, stack: str, index: int, layer: Layer, image_id: str) -> None:
        total, results = len(self.chains[stack]), self.results[stack]
        files = test_files(layer.component, self.images)
        if not files:
            results[index] = LayerTests(layer, note=NO_TESTS)
            return
        description = layer_description(self.plan, stack, layer)
        key = testrecord.layer_key(image_id, description, [*files, *self.shared], self.tools)
        before = None if self.again else testrecord.read_layer_pass(key, self.cache)
        if before is not None:
            results[index] = LayerTests(layer, passed=before.passed, skipped=before.skipped,
                                        seconds=before.seconds, note=CACHED)
            self._say(f"[{index}/{total}] {layer.name}: {before.passed} passed, "
                      f"{before.skipped} skipped, {CACHED} (passed at {before.at} with the same "
                      "image and tests; --again runs it)")
            return
        self._say(f"[{index}/{total}] testing {layer.name} ({len(files)} file(s))")
        self.running[stack].append(self._pool.submit(self._run, stack, index, key, layer, files,
                                                     description))

    def _run(self, stack: str, index: int, key: str, layer: Layer, files: list[Path],
             description: dict) -> None:
        """One layer's run, on the pool's thread: its result reported and a pass remembered
        before the future is done, so :meth:`finish` sees all of it."""
        result = self.results[stack][index] = _run_layer(self.client, layer, files, description)
        self._say(f"[{index}/{len(self.chains[stack])}] {layer.name}: {result.passed} passed, "
                  f"{result.failed} failed, {result.skipped} skipped in {result.seconds:.0f} s"
                  f"{' ' + result.note if result.note else ''}")
        if result.ok:
            testrecord.record_layer_pass(key, testrecord.layer_pass_now(
                layer.name, result.passed, result.skipped, result.seconds), self.cache)

    def _say(self, text: str) -> None:
        with self._lock:
            self.console.print(text, markup=False, highlight=False)

    def finish(self, stack: str) -> list[LayerTests]:
        """Wait for ``stack``'s layers; its table and record; :class:`UserError` unless every
        layer passed."""
        for future in self.running[stack]:
            future.result()  # a runner's own exception (not a failing test) ends the run here
        final_id = self.final_ids[stack]
        results = [self.results[stack][index] for index in sorted(self.results[stack])]
        for result in results:
            if result.output:
                self._say(f"--- {result.layer.name}: pytest's output")
                self.console.file.write(result.output)
                self.console.file.flush()
        _table(self.console, stack, results)
        failed = [r for r in results if r.failed]
        empty = [r for r in results if r.ran_nothing]
        if failed or empty:
            testrecord.record_failure(final_id, stack, self.state)
            parts = []
            if failed:
                parts.append(f"tests failed in {', '.join(r.layer.name for r in failed)}")
            if empty:
                parts.append(f"no test ran in {', '.join(r.why_not_ok() for r in empty)}")
            raise UserError(f"stack {stack}: {'; '.join(parts)}")
        testrecord.record_pass(final_id, stack, self.state)
        return results


def _run_layer(client: docker.DockerClient, layer: Layer, files: list[Path],
               description: dict) -> LayerTests:
    result = LayerTests(layer)
    started = time.monotonic()
    container = client.containers.run(layer.ref, entrypoint=["sleep", "infinity"], detach=True,
                                      labels={"io.github.mnp-stacks.test": layer.tag})
    try:
        with tempfile.TemporaryDirectory(prefix="mnp-test-") as tmp:
            spec_file = Path(tmp) / "layer.json"
            spec_file.write_text(json.dumps(description), encoding="utf-8")
            junit = Path(tmp) / "junit.xml"
            command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                       "--rootdir", str(ROOT), f"--hosts=docker://{container.id}",
                       f"--mnp-layer={spec_file}", f"--junitxml={junit}", "-o",
                       "junit_family=xunit2", *map(str, files)]
            proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False)
            _count(result, junit)
            # 5: pytest collected no test, which ran_nothing reports; any other non-zero exit
            # without a failed test in the report (a collection error) is a failure
            if proc.returncode not in (0, 5) and not result.failed:
                result.failed = 1
            if not result.ok:
                result.output = proc.stdout[-6000:] + proc.stderr[-2000:]
    finally:
        container.remove(force=True)
    result.seconds = time.monotonic() - started
    return result


def _count(result: LayerTests, junit: Path) -> None:
    if not junit.exists():
        result.note = "(pytest wrote no report)"
        return
    for case in ET.parse(junit).getroot().iter("testcase"):
        if case.find("failure") is not None or case.find("error") is not None:
            result.failed += 1
        elif case.find("skipped") is not None:
            result.skipped += 1
        else:
            result.passed += 1


def _table(console: Console, stack: str, results: list[LayerTests]) -> None:
    table = Table(title=f"layer tests: {stack}")
    for column in ("layer", "passed", "failed", "skipped", "time", "result"):
        table.add_column(column)
    for r in results:
        verdict = r.note if r.note == NO_TESTS else ("ok" if r.ok else "FAILED")
        verdict += f" ({CACHED})" if r.note == CACHED else ""
        table.add_row(r.layer.name, str(r.passed), str(r.failed), str(r.skipped),
                      f"{r.seconds:.0f} s", verdict)
    console.print(table)

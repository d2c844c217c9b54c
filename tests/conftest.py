"""Shared fixtures: a Docker engine, and the real cpu-tcp and CUDA images built by the project's
builder, each once per run however many pytest-xdist workers ask for it.

Under ``invoke check`` the suite runs in pytest-xdist workers with ``--dist loadgroup``
(matrix/cli/suite.py). Every test without an ``xdist_group`` mark of its own is given its file as
its group here, so the tests of a file run in one worker, one after the other, as they were
written: a module-scoped fixture (a Slurm cluster, a second engine on a fixed bridge) is set up
once and never shared across processes. A test that must run beside tests of other files (an
engine-wide resource) names a common group: ``@pytest.mark.xdist_group("engine")``.

The groups are handed out longest first, by the seconds tests/group_seconds.json records or,
where this checkout has run ``invoke check`` before, by its last run (tests/suite_groups.py):
started first, a long group (an image build, a container cluster) no longer runs on alone at the
end while the other workers wait.
"""

from __future__ import annotations

import contextlib
import fcntl
import math
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from rich.console import Console

from tests import suite_groups

ROOT = Path(__file__).resolve().parent.parent
LOCKS = ROOT / ".mnp" / "locks"
CUDA_STACK = "cuda13.2-tcp"

# CI runs several pytest workers on a loaded 2-core machine: a slow example there is the
# machine, not a finding. Loaded here, before any test module builds its @settings, so each
# inherits what it does not set itself (one that sets suppress_health_check lists too_slow too).
settings.register_profile("mnp", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("mnp")


def file_group(item: pytest.Item) -> str:
    """The xdist group of a test without one of its own: its file."""
    return item.nodeid.split("::", 1)[0]


def pytest_itemcollected(item: pytest.Item) -> None:
    """As each test is collected, before any pytest_collection_modifyitems (xdist's worker
    appends the group to the node ID there, whatever order the hooks run in)."""
    if item.get_closest_marker("xdist_group") is None:
        item.add_marker(pytest.mark.xdist_group(file_group(item)))


def group_of(item: pytest.Item) -> str:
    mark = item.get_closest_marker("xdist_group")
    return str(mark.args[0] if mark and mark.args else file_group(item))


# The group of the CUDA stack's layer tests (tests/test_cuda_tcp.py's, with the declared-image
# tests). Without a last run (a clean clone, a fresh machine) it goes first: from nothing the build
# takes 14 to 20 min of a 20 to 22 min suite (runs in docs/measurements.md), and then this group
# runs every layer test of the stack, the longest work that waits for the build (80 s in the
# fresh run of e96afed). Handed out later it ran on after every other group had finished; its
# seconds from a warm run, with the layer tests' passes remembered, say nothing of that. Other
# groups that need the build keep their place by their seconds: leading too, one held a second
# worker at the build's lock (822 s of a fresh run, 2026-11-28).
CUDA_LAYER_TESTS = "cuda13.2-tcp layer tests"
# The arm64 CPU stack built under emulation (tests/test_cpu_tcp_arm64.py's group): from nothing,
# minutes of one CPU at qemu's pace, then seconds once built. Without a last run it goes out with
# the CUDA group, so that it runs beside the CUDA build's downloads, not after the rest.
EMULATED_BUILD = "tests/test_cpu_tcp_arm64.py"
# The groups that lead without a last run, in this order.
FROM_NOTHING_FIRST = (CUDA_LAYER_TESTS, EMULATED_BUILD)


def group_seconds() -> tuple[dict[str, float], bool]:
    """Each group's expected seconds: the recorded ones (tests/group_seconds.json) updated by this
    checkout's last run, and whether there was a last run."""
    last = suite_groups.last_run()
    return {**suite_groups.recorded(), **last}, bool(last)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The groups longest first (longest-processing-time-first scheduling: the last groups to
    start are short, so no worker runs on alone at the end). A group neither run nor recorded
    counts as the longest when it holds a slow test, else as the shortest; without a last run
    ``FROM_NOTHING_FIRST`` lead. Equals keep the order of collection (a stable sort). The suite
    runs xdist with ``--no-loadscope-reorder`` (matrix/cli/suite.py): xdist would otherwise hand
    out the groups with the most tests first."""
    seconds, had_last_run = group_seconds()
    slow = {group_of(item) for item in items if item.get_closest_marker("slow")}

    def key(item: pytest.Item) -> tuple[int, float]:
        group = group_of(item)
        lead = len(FROM_NOTHING_FIRST)
        if not had_last_run and group in FROM_NOTHING_FIRST:
            lead = FROM_NOTHING_FIRST.index(group)
        return (lead, -seconds.get(group, math.inf if group in slow else 0.0))

    items.sort(key=key)


@contextlib.contextmanager
def held(name: str) -> Iterator[None]:
    """An exclusive lock shared by every process of this checkout (xdist workers, parallel
    runs): the second to ask waits until the first is done, then finds the work done."""
    LOCKS.mkdir(parents=True, exist_ok=True)
    with (LOCKS / f"{name}.lock").open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def build_stack(client, stack: str, tests_state: Path | None = None):
    """Plan and build ``stack`` with the project's builder, once across processes: the first
    worker builds, the next ones find every layer by its content tag and build nothing.

    With ``tests_state``, the stack's layer tests run as ``invoke build --test`` runs them, each
    layer's once it is built (records in that folder), and the third item is their outcome: the
    list of :class:`matrix.image.testing.LayerTests`, or the :class:`UserError` that ended them."""
    from matrix.errors import UserError
    from matrix.image import build, ca, testing
    from matrix.image.plan import plan
    from matrix.model.loader import load_matrix

    console = Console(highlight=False, width=160)
    with held(f"build-{stack}"), contextlib.ExitStack() as running:
        # planned under the lock: the worker before may have bootstrapped the base meanwhile,
        # and the builder refuses a plan whose base has changed since
        result = plan(load_matrix(ROOT / "stacks.yaml"), [stack])
        tests = (running.enter_context(testing.LayerTestRun(client, result, [stack], console,
                                                            tests_state))
                 if tests_state else None)
        results = build.build(client, result, [stack], ca_bundle=ca.resolve(None),
                              console=console, on_layer=tests.built if tests else None)
        if tests is None:
            return result, results, None
        try:
            return result, results, tests.finish(stack)
        except UserError as exc:
            return result, results, exc


@pytest.fixture(scope="session")
def docker_client():
    """A client for the local engine; the suite starts one (as CI does) when none answers."""
    from matrix.errors import UserError
    from matrix.image import engine

    try:
        return engine.ensure()
    except UserError as exc:
        pytest.fail(f"these tests need a Docker engine: {exc}")


@pytest.fixture(scope="session")
def cpu_tcp_build(docker_client):
    """Build the default stack with the project's own builder (cached layers are reused)."""
    return build_stack(docker_client, "cpu-tcp")[:2]


@pytest.fixture(scope="session")
def cpu_tcp_image(cpu_tcp_build) -> str:
    """Reference of the built cpu-tcp image (its content-addressed tag)."""
    result, _ = cpu_tcp_build
    return result.chains["cpu-tcp"][-1]


@pytest.fixture(scope="session")
def cuda_tcp_built(docker_client, tmp_path_factory):
    """The CUDA TCP stack built once per run, its layer tests run as `invoke build --test` runs
    them, each layer's while the layers above it build (the build takes minutes: every test that
    needs it shares this one; the lock keeps two workers from building it side by side)."""
    return build_stack(docker_client, CUDA_STACK, tmp_path_factory.mktemp("cuda-tests"))


@pytest.fixture(scope="session")
def cuda_tcp_build(cuda_tcp_built):
    """The plan of the built CUDA TCP stack."""
    return cuda_tcp_built[0]


@pytest.fixture(scope="session")
def cuda_tcp_layer_tests(cuda_tcp_built):
    """The outcome of its layer tests: the layers' results, or the error that ended the run."""
    return cuda_tcp_built[2]

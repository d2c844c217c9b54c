"""``invoke test`` fails a layer whose tests all skip, or whose test files collect none: such a
layer was not tested, and the run's result gates ``invoke push`` (matrix/image/testing.py)."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from matrix.errors import UserError
from matrix.image import testing, testrecord
from matrix.model.settings import IMAGES
from tests.build_project import project_files, run_build

pytestmark = pytest.mark.docker
project_fixture = pytest.fixture(name="project")(project_files)

PASSES = "def test_marker(host):\n    assert host.file('/layer-{name}').exists\n"
SKIPS = "import pytest\ndef test_marker(host):\n    pytest.skip('not for this layer')\n"
NONE = "def helper(host):\n    return host.file('/layer-gamma')\n"  # collects no test


def layer_tests(project, **files: str) -> None:
    (project["images"] / "conftest.py").write_text((IMAGES / "conftest.py").read_text())
    for name, text in files.items():
        (project["images"] / name / f"test_{name}.py").write_text(text.format(name=name))


def run_tests(docker_client, project, result):
    return testing.run_stack_tests(docker_client, result, "one",
                                   Console(file=io.StringIO(), width=200),
                                   project["state"] / "test-results", images=project["images"],
                                   cache=project["state"] / "layer-passes")


def test_a_layer_whose_tests_all_skip_or_collect_none_fails_the_run(docker_client, project):
    layer_tests(project, alpha=SKIPS, beta=PASSES, gamma=NONE)
    result, _ = run_build(docker_client, project, ["one"])
    with pytest.raises(UserError) as caught:
        run_tests(docker_client, project, result)
    assert str(caught.value) == ("stack one: no test ran in alpha 1.0 (all 1 tests skipped), "
                                 "gamma 1.0 (no test collected)")
    image_id = docker_client.images.get(result.final_ref("one")).id
    assert testrecord.read_record(image_id, project["state"] / "test-results").result == "failed"


def test_every_layer_with_a_passing_test_passes(docker_client, project):
    """The same stack with a test that runs in each layer: the run passes and is recorded."""
    layer_tests(project, alpha=PASSES, beta=PASSES, gamma=PASSES)
    result, _ = run_build(docker_client, project, ["one"])
    outcome = run_tests(docker_client, project, result)
    assert [(r.layer.name, r.passed, r.ok) for r in outcome][:3] == [
        ("alpha 1.0", 1, True), ("beta 1.0", 1, True), ("gamma 1.0", 1, True)]
    image_id = docker_client.images.get(result.final_ref("one")).id
    assert testrecord.read_record(image_id, project["state"] / "test-results").result == "passed"


def test_a_layer_that_passed_with_the_same_inputs_is_reported_from_its_record(docker_client,
                                                                               project):
    """A pass is kept per layer under a digest of its inputs: the second run runs nothing that
    passed, a changed test file runs its layer again, a failure is never kept, and ``again``
    runs everything."""
    layer_tests(project, alpha=PASSES, beta=PASSES, gamma=PASSES)
    result, _ = run_build(docker_client, project, ["one"])
    first = run_tests(docker_client, project, result)
    assert [r.note for r in first][:3] == ["", "", ""]

    second = run_tests(docker_client, project, result)
    assert [(r.layer.name, r.passed, r.note) for r in second][:3] == [
        ("alpha 1.0", 1, testing.CACHED), ("beta 1.0", 1, testing.CACHED),
        ("gamma 1.0", 1, testing.CACHED)]
    image_id = docker_client.images.get(result.final_ref("one")).id
    assert testrecord.read_record(image_id, project["state"] / "test-results").result == "passed"

    failing = "def test_marker(host):\n    assert not host.file('/layer-beta').exists\n"
    (project["images"] / "beta" / "test_beta.py").write_text(failing)
    for _ in range(2):  # the failure is not kept: beta runs, and fails, each time
        with pytest.raises(UserError, match=r"tests failed in beta 1\.0"):
            run_tests(docker_client, project, result)
    assert testrecord.read_record(image_id, project["state"] / "test-results").result == "failed"

    layer_tests(project, beta=PASSES)  # back to the test that passed: its record counts again
    third = run_tests(docker_client, project, result)
    assert [r.note for r in third][:3] == [testing.CACHED] * 3
    again = testing.run_stack_tests(docker_client, result, "one",
                                    Console(file=io.StringIO(), width=200),
                                    project["state"] / "test-results",
                                    images=project["images"], again=True,
                                    cache=project["state"] / "layer-passes")
    assert [(r.passed, r.note) for r in again][:3] == [(1, "")] * 3

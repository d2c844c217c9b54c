"""``invoke test`` fails a layer whose tests all skip, or whose test files collect none: such a
layer was not tested, and the run's result gates ``invoke push`` (matrix/image/testing.py). A
pass is kept per layer by its inputs, and ``invoke build --test`` starts a layer's tests once the
build has made it."""

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


SLOW_TEMPLATE = """{% import "_macros.j2" as m %}
FROM {{ parent }}
{{ m.preamble(component, version) }}
RUN sleep 5 && echo "{{ component }} {{ version }}" > /layer-{{ component }}
"""


def test_build_test_runs_a_layers_tests_while_the_layers_above_it_build(docker_client, project,
                                                                        monkeypatch):
    """As ``invoke build --test`` runs them (matrix/cli/images.py): the builder hands each layer
    to the test run once its image is here, and that layer's tests start then, not after the
    build: alpha's run begins before gamma (a 5-second build) is done. The run is recorded."""
    from matrix.image import build
    from matrix.image.plan import plan
    from matrix.model.loader import load_matrix

    layer_tests(project, alpha=PASSES, beta=PASSES, gamma=PASSES)
    (project["images"] / "gamma" / "Dockerfile.j2").write_text(SLOW_TEMPLATE)
    events: list[str] = []
    real_run = testing._run_layer

    def watched_run(client, layer, files, description):  # the real run, its start noted
        events.append(f"testing {layer.component}")
        return real_run(client, layer, files, description)

    monkeypatch.setattr(testing, "_run_layer", watched_run)
    result = plan(load_matrix(project["stacks"]), ["one"], images=project["images"],
                  root=project["images"].parent)
    console = Console(file=io.StringIO(), width=200)
    records = project["state"] / "test-results"
    with testing.LayerTestRun(docker_client, result, ["one"], console, records,
                              images=project["images"],
                              cache=project["state"] / "layer-passes") as run:

        def built(layer):
            events.append(f"built {layer.component}")
            run.built(layer)

        build.build(docker_client, result, ["one"], console=console, state=project["state"],
                    on_layer=built)
        outcome = run.finish("one")
    assert events.index("testing alpha") < events.index("built gamma"), events
    assert [(r.layer.name, r.passed, r.ok) for r in outcome][:3] == [
        ("alpha 1.0", 1, True), ("beta 1.0", 1, True), ("gamma 1.0", 1, True)]
    image_id = docker_client.images.get(result.final_ref("one")).id
    assert testrecord.read_record(image_id, records).result == "passed"

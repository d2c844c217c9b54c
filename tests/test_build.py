"""The builder on a real engine: skip-unchanged, rebuild scope, sharing, labels, failures, sizes,
and the extra CA that must never reach an image. Uses small throwaway stacks for speed."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import io
import json
import tarfile
import uuid

import pytest
from rich.console import Console

from matrix.errors import UserError
from matrix.image import ca
from tests.build_project import project_files, remove_repository, run_build, stacks_text
from tests.layer_checks import apt_cache_files

pytestmark = pytest.mark.docker
project_fixture = pytest.fixture(name="project")(project_files)


def test_second_build_builds_nothing(docker_client, project):
    _, first = run_build(docker_client, project, ["one"])
    assert [s for _, s in first] == ["built"] * 4
    _, second = run_build(docker_client, project, ["one"])
    assert [s for _, s in second] == ["cached"] * 4
    assert "0 layer(s) built, 4 cached" in project["log"]


def test_change_rebuilds_layer_and_descendants_only(docker_client, project):
    run_build(docker_client, project, ["one"])
    template = project["images"] / "beta" / "Dockerfile.j2"
    template.write_text(template.read_text() + "RUN echo changed > /changed\n")
    _, statuses = run_build(docker_client, project, ["one"])
    assert statuses == [("alpha 1.0", "cached"), ("beta 1.0", "built"), ("gamma 1.0", "built"),
                        ("_stack", "built")]


def test_all_builds_shared_layers_once(docker_client, project):
    result, statuses = run_build(docker_client, project, ["one", "two"])
    shared = [layer for layer in result.order(["one", "two"]) if len(layer.stacks) == 2]
    assert [layer.component for layer in shared] == ["alpha", "beta"]
    assert [s for _, s in statuses] == ["built"] * 6  # 4 for one, delta and its label layer
    assert project["log"].count("alpha 1.0: building") == 1


def test_a_projects_teardown_leaves_another_projects_tag_on_a_shared_image(docker_client,
                                                                           project):
    # Two projects' identical layers are one cached image carrying both projects' tags; a
    # teardown that untagged all of that image's tags broke a build running beside it (CI, stop 39).
    result, _ = run_build(docker_client, project, ["one"])
    alpha = result.chains["one"][0]
    other = f"mnp-test-other-{uuid.uuid4().hex[:8]}"
    docker_client.images.get(alpha).tag(other, "alpha")
    try:
        remove_repository(docker_client, project["repo"])
        assert docker_client.images.list(name=project["repo"]) == []
        assert docker_client.images.get(f"{other}:alpha").id
    finally:
        with contextlib.suppress(Exception):
            docker_client.images.remove(f"{other}:alpha")


def test_final_tag_and_labels(docker_client, project):
    result, _ = run_build(docker_client, project, ["one"])
    image = docker_client.images.get(f"{project['repo']}:one")
    assert image.id == docker_client.images.get(result.chains["one"][-1]).id
    labels = image.labels
    for component in ("alpha", "beta", "gamma"):
        assert labels[f"io.github.mnp-stacks.component.{component}"] == "1.0"
    assert labels["org.opencontainers.image.title"] == "one"
    assert labels["org.opencontainers.image.base.name"] == "debian:bookworm"


def test_an_apt_run_leaves_no_package_cache_even_when_dpkg_never_runs(docker_client, project):
    # m.apt_install keeps the package cache `apt-get update` writes for `apt-get install`. The
    # base's docker-clean deletes it after a dpkg run; installing what the base already has
    # (apt) runs no dpkg, so only the macro's own clean-up is left to delete it.
    template = project["images"] / "alpha" / "Dockerfile.j2"
    template.write_text(template.read_text() + '{{ m.apt_install({}, extra="apt") }}\n')
    result, statuses = run_build(docker_client, project, ["one"])
    assert statuses[0] == ("alpha 1.0", "built")
    assert apt_cache_files(docker_client, result.chains["one"][0]) == []


def test_failed_layer_shows_log_tail_and_skips_descendants(docker_client, project):
    template = project["images"] / "beta" / "Dockerfile.j2"
    template.write_text(template.read_text() + "RUN echo boom-marker && exit 3\n")
    with pytest.raises(UserError, match=r"layer beta 1.0 failed to build; full log: .*\.log"):
        run_build(docker_client, project, ["one"])
    log = project["log"]
    assert "beta 1.0: FAILED" in log and "boom-marker" in log
    assert "gamma 1.0: skipped (a parent failed)" in log


def test_size_budget_fails_the_build(docker_client, project):
    project["stacks"].write_text(stacks_text(project["repo"], budget="    size_budget_mb: 1\n"))
    with pytest.raises(UserError, match=r"stack one: image is \d+ MB, over its size_budget_mb of 1"):
        run_build(docker_client, project, ["one"])


def test_extra_ca_is_used_but_never_stored(docker_client, project, tmp_path):
    marker = f"MNPCAMARKER{uuid.uuid4().hex}"
    bundle = tmp_path / "proxy-ca.pem"
    bundle.write_text(f"-----BEGIN CERTIFICATE-----\n{marker}\n-----END CERTIFICATE-----\n")
    result, _ = run_build(docker_client, project, ["ca"], ca_bundle=bundle)
    ref = result.chains["ca"][-1]
    image = docker_client.images.get(ref)
    # It was there during the build step...
    container = docker_client.containers.run(ref, ["cat", "/ca-seen-during-build"], remove=True)
    assert container.decode().strip() == hashlib.sha256(bundle.read_bytes()).hexdigest()
    # ...and is in no layer, no history entry and no config of the image.
    saved = b"".join(image.save())
    with tarfile.open(fileobj=io.BytesIO(saved)) as outer:
        for member in outer.getmembers():
            if member.isfile():
                data = outer.extractfile(member).read()
                assert marker.encode() not in data, f"CA content found in {member.name}"
                if member.name.endswith(".tar"):
                    with tarfile.open(fileobj=io.BytesIO(data)) as layer:
                        names = layer.getnames()
                        assert not [n for n in names if n.endswith("mnp-ca.pem")]
    history = json.dumps(docker_client.api.history(ref))
    assert marker not in history and "BEGIN CERTIFICATE" not in history


def test_ca_bundle_option_is_checked(tmp_path):
    not_pem = tmp_path / "x.pem"
    not_pem.write_text("hello")
    with pytest.raises(UserError, match="--ca-bundle: .* is not a PEM CA bundle"):
        ca.resolve(str(not_pem))
    with pytest.raises(UserError, match="--ca-bundle: cannot read CA bundle"):
        ca.resolve(str(tmp_path / "missing.pem"))


def test_unavailable_base_gives_clear_error(docker_client, project):
    text = project["stacks"].read_text().replace(
        "image: debian:bookworm\n    os: debian12",
        "image: nvidia/cuda:10.1-cudnn7-devel-ubuntu18.04\n    os: ubuntu18.04\n"
        "    provide_hint: docker load it")
    project["stacks"].write_text(text)
    with pytest.raises(UserError, match=r"base image nvidia/cuda:10.1-cudnn7-devel-ubuntu18.04 "
                                        r".*cannot be pulled .*docker load it"):
        run_build(docker_client, project, ["one"])


def test_no_engine_is_a_clear_error(monkeypatch):
    from matrix.image import engine

    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    with pytest.raises(UserError, match="no Docker engine answers at unix:///nonexistent"):
        engine.ensure()


def test_debian_base_is_bootstrapped_when_missing(docker_client, monkeypatch):
    """No registry: a Debian base that is neither local nor pullable is made with mmdebstrap;
    the local one is then used as it is, until stacks.yaml gives it another recipe."""
    from matrix.image import bootstrap
    from matrix.model.entities import Base

    name = f"mnp-test-base-{uuid.uuid4().hex[:8]}:bookworm"
    base = Base(name="t", image=name, os="debian12", provides={},
                bootstrap={"suite": "bookworm", "mirror": "http://deb.debian.org/debian"})
    try:
        assert bootstrap.ensure_base(docker_client, base, log=lambda _: None) == "bootstrapped"
        out = docker_client.containers.run(name, ["cat", "/etc/debian_version"], remove=True)
        assert out.decode().startswith("12.")
        assert bootstrap.ensure_base(docker_client, base, log=lambda _: None) == "local"
        # Another recipe (a second component): made again, with a line saying why. The making
        # itself is what ran above; here only the decision is watched.
        changed = dataclasses.replace(base, bootstrap={**base.bootstrap,
                                                       "components": ["main", "contrib"]})
        said, made = [], []
        monkeypatch.setattr(bootstrap, "bootstrap", lambda client, wanted: made.append(wanted))
        assert bootstrap.ensure_base(docker_client, changed, log=said.append) == "bootstrapped"
        assert made == [changed]
        assert said == [f"base {name}: bootstrapped by recipe {bootstrap.recipe_digest(base)}, "
                        f"stacks.yaml now gives {bootstrap.recipe_digest(changed)}; "
                        "bootstrapping it again"]
    finally:
        with contextlib.suppress(Exception):
            docker_client.images.remove(name)


LAYER_TEST = "def test_alpha_marker(host):\n    assert host.file('{path}').exists\n"


def test_failed_test_run_withdraws_the_pass_and_push_refuses(docker_client, project):
    """Build, test (passes), break a layer test, test (fails): the push of that image refuses."""
    from matrix.deploy.publish import RetryPolicy, push_stack
    from matrix.image import testing, testrecord
    from matrix.model.settings import IMAGES

    (project["images"] / "conftest.py").write_text((IMAGES / "conftest.py").read_text())
    test_file = project["images"] / "alpha" / "test_alpha.py"
    test_file.write_text(LAYER_TEST.format(path="/layer-alpha"))
    result, _ = run_build(docker_client, project, ["one"])
    records = project["state"] / "test-results"
    console = Console(file=io.StringIO(), width=200)

    def test_and_push():
        testing.run_stack_tests(docker_client, result, "one", console, records,
                                images=project["images"], cache=project["state"] / "passes")
        # The gate is checked before the registry is contacted: no registry needed to refuse.
        push_stack(docker_client, result.chains["one"], result.final_ref("one"), "one",
                   "127.0.0.1:9", "0123abc", state_dir=records, log=lambda _: None,
                   retry=RetryPolicy(attempts=1))

    image_id = docker_client.images.get(result.final_ref("one")).id
    with pytest.raises(UserError, match=r"checking 127\.0\.0\.1:9/"):  # passed: the gate lets it through
        test_and_push()
    assert testrecord.read_record(image_id, records).result == "passed"
    test_file.write_text(LAYER_TEST.format(path="/not-there"))
    with pytest.raises(UserError, match="stack one: tests failed in alpha 1.0"):
        test_and_push()
    assert testrecord.read_record(image_id, records).result == "failed"
    with pytest.raises(UserError, match=r"stack one: image sha256:\w+ has no passing test"):
        push_stack(docker_client, result.chains["one"], result.final_ref("one"), "one",
                   "127.0.0.1:9", "0123abc", state_dir=records, log=lambda _: None)


def test_test_results_path_that_is_a_file_is_one_line(docker_client, project):
    from matrix.image import testing

    result, _ = run_build(docker_client, project, ["one"])
    project["state"].mkdir(exist_ok=True)
    blocker = project["state"] / "test-results"
    blocker.write_text("not a folder")
    with pytest.raises(UserError, match=r"cannot write test records to .*test-results"):
        testing.run_stack_tests(docker_client, result, "one", Console(file=io.StringIO()),
                                blocker, images=project["images"], cache=project["state"] / "passes")


def test_re_pointed_content_tag_is_rebuilt_not_trusted(docker_client, project):
    """A content tag moved to another image (here: beta's tag onto gamma's image, which carries
    beta's label too and is built on alpha) is rebuilt, with a line saying why."""
    result, _ = run_build(docker_client, project, ["one"])
    alpha, beta, gamma, _ = result.chain("one")
    repository, tag = beta.ref.rsplit(":", 1)
    docker_client.images.get(gamma.ref).tag(repository, tag)
    _, statuses = run_build(docker_client, project, ["one"])
    assert statuses[:2] == [("alpha 1.0", "cached"), ("beta 1.0", "built")]
    assert (f"beta 1.0: the image tagged {beta.ref} has label "
            "io.github.mnp-stacks.component.gamma='1.0' where its Dockerfile gives None; "
            "rebuilding it") in project["log"]
    labels = docker_client.images.get(beta.ref).labels
    assert labels["io.github.mnp-stacks.component.beta"] == "1.0"
    assert "io.github.mnp-stacks.component.gamma" not in labels
    # Re-pointing the base-most layer onto its own parent is caught by the same check.
    docker_client.images.get("debian:bookworm").tag(*alpha.ref.rsplit(":", 1))
    _, statuses = run_build(docker_client, project, ["one"])
    assert statuses[0] == ("alpha 1.0", "built")
    assert "has label io.github.mnp-stacks.component.alpha=None where its Dockerfile gives '1.0'" \
        in project["log"]

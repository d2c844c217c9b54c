"""What a command remembers in the user's cache folder (matrix/model/settings.py ``user_cache``)
to be faster next time: schema passes (matrix/model/schema.py), compiled templates
(matrix/image/render.py), the Kubeflow CRDs' schemas as JSON (matrix/jobs/crds.py) and checked
YAML files parsed, as JSON (matrix/model/yamlsrc.py). Each is
checked for the speed it exists for and for never changing an answer: an edited file is checked
again, and a cache that cannot be written changes nothing."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from matrix.errors import UserError
from matrix.model.settings import ROOT

# One process loads the matrix and says whether it imported jsonschema (which only a check does).
LOAD = ("import sys; from pathlib import Path; from matrix.model.loader import load_matrix; "
        "load_matrix(Path(sys.argv[1])); print('jsonschema' in sys.modules)")


def load_in_a_new_process(stacks: Path, cache: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", LOAD, str(stacks)], cwd=ROOT, text=True,
                          capture_output=True, env=dict(os.environ, XDG_CACHE_HOME=str(cache)))


def test_a_matrix_that_passed_is_not_checked_again(tmp_path):
    first = load_in_a_new_process(ROOT / "stacks.yaml", tmp_path)
    second = load_in_a_new_process(ROOT / "stacks.yaml", tmp_path)
    assert (first.returncode, second.returncode) == (0, 0), first.stderr + second.stderr
    assert (first.stdout.strip(), second.stdout.strip()) == ("True", "False")
    assert list((tmp_path / "mnp-stacks" / "schema-passes").iterdir())


@pytest.mark.parametrize(("edit", "error"), [
    # the document against its schema
    (("repository: mnp-stacks", "repository: 7"), "repository: expected string"),
    # a component version's options against its component's options schema
    (("options: {packages: [openssh-client, openssh-server]}",
      "options: {packages: [openssh-client, openssh-server], no_such_option: 1}"),
     "no_such_option"),
])
def test_an_edited_matrix_is_checked_again(tmp_path, monkeypatch, edit, error):
    from matrix.model.loader import load_matrix

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    stacks = tmp_path / "stacks.yaml"
    shutil.copy(ROOT / "stacks.yaml", stacks)
    load_matrix(stacks)  # passes, and is remembered
    stacks.write_text(stacks.read_text(encoding="utf-8").replace(*edit, 1), encoding="utf-8")
    with pytest.raises(UserError, match=error):
        load_matrix(stacks)


def test_a_cache_that_cannot_be_written_only_means_checking_again(tmp_path):
    blocked = tmp_path / "not-a-folder"
    blocked.write_text("")
    for _ in range(2):
        proc = load_in_a_new_process(ROOT / "stacks.yaml", blocked)
        assert proc.returncode == 0 and proc.stdout.strip() == "True", proc.stderr


def test_templates_compiled_once_render_the_same_and_follow_an_edit(tmp_path):
    """A second process renders from Jinja's compiled-template cache; a changed template is
    compiled again (Jinja keys each by its source's checksum)."""
    images = tmp_path / "images"
    (images / "toy").mkdir(parents=True)
    template = images / "toy" / "Dockerfile.j2"
    render = ("import sys; from pathlib import Path; from matrix.image import render; "
              "print(render.environment(Path(sys.argv[1])).get_template('toy/Dockerfile.j2')"
              ".render(v='1'), end='')")
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "cache"))

    def rendered() -> str:
        proc = subprocess.run([sys.executable, "-c", render, str(images)], cwd=ROOT, env=env,
                              capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout

    template.write_text("FROM scratch\nLABEL v={{ v }}\n")
    assert rendered() == rendered() == "FROM scratch\nLABEL v=1\n"
    assert list((tmp_path / "cache" / "mnp-stacks" / "templates").iterdir())  # it was cached
    template.write_text("FROM scratch\nLABEL w={{ v }}\n")
    assert rendered() == "FROM scratch\nLABEL w=1\n"
    env["XDG_CACHE_HOME"] = str(template)  # a file: no cache folder can be made under it
    assert rendered() == "FROM scratch\nLABEL w=1\n"


def test_lint_fails_on_a_finding_and_lints_a_file_that_passed_only_once(tmp_path, monkeypatch):
    from matrix.image import hadolint

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    config = ROOT / ".hadolint.yaml"
    good, bad = tmp_path / "good.Dockerfile", tmp_path / "bad.Dockerfile"
    good.write_text("FROM debian:bookworm\nUSER nobody\n")
    bad.write_text("FROM debian:latest\nUSER nobody\n")  # DL3007, a warning: the threshold
    hadolint.check([good], config)
    passes = tmp_path / "cache" / "mnp-stacks" / "lint-passes"
    assert len(list(passes.iterdir())) == 1
    with pytest.raises(UserError, match="hadolint found problems"):
        hadolint.check([good, bad], config)
    assert len(list(passes.iterdir())) == 1  # a failing run remembers nothing
    started = []
    monkeypatch.setattr(hadolint.subprocess, "run", lambda *a, **k: started.append(a))
    hadolint.check([good], config)
    assert started == []  # passed before: hadolint not started again
    good.write_text("FROM debian:bookworm\nUSER root\n")
    with pytest.raises(AttributeError):  # an edited file is linted: the stand-in returns None
        hadolint.check([good], config)
    assert len(started) == 1


def test_crd_schemas_come_from_the_cache_as_the_vendored_files_give_them(tmp_path, monkeypatch):
    """The served ``openAPIV3Schema`` of each vendored CRD, parsed once and then read from the
    user's cache (no YAML parsed), equal to the YAML's; a broken cache file or a cache that
    cannot be written means the YAML is parsed again."""
    from matrix.jobs import crds
    from matrix.model import yamlsrc

    def served(crd: crds.Crd) -> dict:
        document = yamlsrc.load_shipped((crds.SCHEMAS / crd.file).read_text(encoding="utf-8"))
        group = document["spec"]["group"]
        (found,) = [v["schema"]["openAPIV3Schema"] for v in document["spec"]["versions"]
                    if f"{group}/{v['name']}" == crd.api_version and v.get("served")]
        return found

    def fresh(kind: str) -> dict:
        crds.schema.cache_clear()  # the process's own cache: each call reads again
        return crds.schema(kind)

    want = {kind: served(crd) for kind, crd in crds.CRDS.items()}
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    try:
        assert {kind: fresh(kind) for kind in crds.CRDS} == want
        folder = tmp_path / "cache" / "mnp-stacks" / crds.CACHE
        files = sorted(folder.iterdir())
        assert len(files) == len(crds.CRDS)

        def no_yaml(text):
            raise AssertionError("parsed a CRD's YAML with its schema in the cache")

        with monkeypatch.context() as patched:
            patched.setattr(crds.yamlsrc, "load_shipped", no_yaml)
            assert {kind: fresh(kind) for kind in crds.CRDS} == want
        files[0].write_text('{"type": "obj', encoding="utf-8")  # cut short
        assert {kind: fresh(kind) for kind in crds.CRDS} == want
        assert sorted(folder.iterdir()) == files  # written again, nothing else left
        blocked = tmp_path / "a-file"
        blocked.write_text("")
        monkeypatch.setenv("XDG_CACHE_HOME", str(blocked))
        assert {kind: fresh(kind) for kind in crds.CRDS} == want
    finally:
        crds.schema.cache_clear()


def test_a_checked_file_is_read_parsed_from_the_cache_and_an_edit_is_parsed_again(tmp_path,
                                                                                   monkeypatch):
    """stacks.yaml, once it passed its schema, comes to the next load from the user's cache (no
    YAML composed) with the same data and the same lines; an edited file is parsed again; a file
    that fails its schema, and data JSON would change (a mapping key that is not a string), leave
    nothing there; an entry cut short is parsed again."""
    from matrix.model import yamlsrc
    from matrix.model.loader import load_matrix

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    folder = tmp_path / "cache" / "mnp-stacks" / yamlsrc.PARSED
    stacks = tmp_path / "stacks.yaml"
    text = (ROOT / "stacks.yaml").read_text(encoding="utf-8")
    stacks.write_text(text, encoding="utf-8")
    first = load_matrix(stacks).located
    entry = folder / yamlsrc._cache_name(text)
    assert not first.from_cache and entry.is_file()

    def parsed_again() -> yamlsrc.Located:
        with monkeypatch.context() as patched:
            patched.setattr(yamlsrc, "_BoundedLoader", None)  # composing would raise TypeError
            return load_matrix(stacks).located

    again = parsed_again()
    assert again.from_cache and (again.data, again.lines) == (first.data, first.lines)
    assert again.where(("stacks", "cpu-tcp", "base")) == first.where(("stacks", "cpu-tcp", "base"))
    other = text.replace("repository: mnp-stacks", "repository: mnp-other", 1)
    stacks.write_text(other, encoding="utf-8")
    edited = load_matrix(stacks).located
    assert not edited.from_cache and edited.data["repository"] == "mnp-other"
    assert (folder / yamlsrc._cache_name(other)).is_file()
    failing = text.replace("repository: mnp-stacks", "repository: 7", 1)
    stacks.write_text(failing, encoding="utf-8")
    with pytest.raises(UserError, match="repository: expected string"):
        load_matrix(stacks)
    assert not (folder / yamlsrc._cache_name(failing)).exists()
    int_keys = "{1: one}\n"
    yamlsrc.loads(int_keys, tmp_path / "int-keys.yaml").remember()
    assert not (folder / yamlsrc._cache_name(int_keys)).exists()
    entry.write_text('{"data": {"reposit', encoding="utf-8")  # cut short
    stacks.write_text(text, encoding="utf-8")
    assert not load_matrix(stacks).located.from_cache
    assert parsed_again().from_cache  # written whole again

"""Loading stacks files: schema errors carry file, line and key; references are resolved."""

from __future__ import annotations

from pathlib import Path

import pytest

from matrix.errors import UserError
from matrix.model.loader import load_matrix
from tests.helpers import write

ROOT = Path(__file__).resolve().parent.parent

GOOD = """\
repository: test-stacks
bases:
  debian-12:
    image: debian:bookworm
    os: debian12
    provides: {python: "3.11.2"}
components:
  ssh:
    description: ssh
    versions:
      "9.2p1": {source: apt, options: {packages: [openssh-client]}}
  entrypoint:
    description: e
    versions:
      "0.1.0": {source: project}
stacks:
  small:
    description: a small stack
    base: debian-12
    instances: [c5n.18xlarge]
    fabric: tcp
    layers:
      - ssh: "9.2p1"
      - entrypoint: "0.1.0"
"""


def load_text(tmp_path: Path, text: str):
    return load_matrix(write(tmp_path / "stacks.yaml", text))


def error_of(tmp_path: Path, text: str) -> str:
    with pytest.raises(UserError) as info:
        load_text(tmp_path, text)
    return str(info.value)


def test_project_stacks_file_loads():
    matrix = load_matrix(ROOT / "stacks.yaml")
    assert "cpu-tcp" in matrix.stacks
    cpu = matrix.stack("cpu-tcp")
    assert [layer.component for layer in cpu.layers][-1] == "entrypoint"
    assert cpu.versions()["python"] == "3.11.2"


def test_good_file_resolves_layers(tmp_path):
    matrix = load_text(tmp_path, GOOD)
    stack = matrix.stack("small")
    assert stack.base.image == "debian:bookworm"
    assert [(cv.component, cv.version) for cv in stack.layers] == [("ssh", "9.2p1"),
                                                                    ("entrypoint", "0.1.0")]
    assert stack.where.endswith("stacks.yaml:17")


def test_unquoted_version_names_line_and_key(tmp_path):
    message = error_of(tmp_path, GOOD.replace('- ssh: "9.2p1"', "- ssh: 9.2"))
    assert "stacks.yaml:23" in message
    assert "stacks/small/layers/0/ssh" in message
    assert "expected string" in message


def test_unknown_key_is_named(tmp_path):
    message = error_of(tmp_path, GOOD.replace("    fabric: tcp", "    fabric: tcp\n    gpus: 8"))
    assert "stacks.yaml:" in message and "gpus" in message and "allowed" in message


def test_bad_enum(tmp_path):
    message = error_of(tmp_path, GOOD.replace("fabric: tcp", "fabric: infiniband"))
    assert "stacks.yaml:21" in message and "fabric" in message


def test_unknown_component(tmp_path):
    message = error_of(tmp_path, GOOD.replace('- ssh: "9.2p1"', '- sshd: "9.2p1"'))
    assert message.startswith(f"{tmp_path / 'stacks.yaml'}:23: ")
    assert "unknown component 'sshd'" in message


def test_unknown_version_lists_declared(tmp_path):
    message = error_of(tmp_path, GOOD.replace('- ssh: "9.2p1"', '- ssh: "8.0"'))
    assert "ssh has no version '8.0'" in message and "9.2p1" in message


def test_unknown_base(tmp_path):
    message = error_of(tmp_path, GOOD.replace("base: debian-12", "base: ubuntu-22"))
    assert ":19:" in message and "unknown base 'ubuntu-22'" in message


def test_duplicate_key(tmp_path):
    message = error_of(tmp_path, GOOD.replace("    fabric: tcp", "    fabric: tcp\n    fabric: efa"))
    assert "duplicate key 'fabric'" in message and ":22:" in message


def test_yaml_syntax_error_has_line(tmp_path):
    message = error_of(tmp_path, GOOD.replace("fabric: tcp", "fabric: [tcp"))
    assert "invalid YAML" in message and "stacks.yaml:" in message


def test_missing_file():
    with pytest.raises(UserError, match="nope.yaml: file not found"):
        load_matrix(Path("nope.yaml"))


def test_component_twice_in_stack(tmp_path):
    message = error_of(tmp_path, GOOD.replace('- entrypoint: "0.1.0"', '- ssh: "9.2p1"'))
    assert "ssh appears twice" in message


def test_bad_sha256(tmp_path):
    text = GOOD.replace('"0.1.0": {source: project}',
                        '"0.1.0": {source: download, download: {url: "https://x/y", sha256: abc}}')
    message = error_of(tmp_path, text)
    assert "sha256" in message and "does not match" in message


def test_plain_http_download_refused(tmp_path):
    sha = "0" * 64
    text = GOOD.replace('"0.1.0": {source: project}',
                        f'"0.1.0": {{source: download, download: {{url: "http://x/y", sha256: {sha}}}}}')
    assert "url" in error_of(tmp_path, text)


def test_unknown_stack_name(tmp_path):
    matrix = load_text(tmp_path, GOOD)
    with pytest.raises(UserError, match="no stack named 'big'.*small"):
        matrix.stack("big")


def test_unknown_instance_type_names_file_and_line(tmp_path):
    message = error_of(tmp_path, GOOD.replace("instances: [c5n.18xlarge]",
                                              "instances:\n      - c5n.18xlarge\n      - p9.96xlarge"))
    assert message.startswith(f"{tmp_path / 'stacks.yaml'}:22: ")
    assert "stacks/small/instances/1" in message and "'p9.96xlarge'" in message
    assert "instance table" in message


def test_hyphenated_instance_type_is_accepted(tmp_path):
    matrix = load_text(tmp_path, GOOD.replace("instances: [c5n.18xlarge]",
                                              "instances: [p6-b200.48xlarge]"))
    assert matrix.stack("small").instances == ("p6-b200.48xlarge",)


def test_component_fact_needs_its_source(tmp_path):
    text = GOOD.replace('"9.2p1": {source: apt, options: {packages: [openssh-client]}}',
                        '"9.2p1": {source: apt, os: [debian12], options: {packages: [openssh-client]}}')
    message = error_of(tmp_path, text)
    assert "stacks.yaml:11" in message and "sources" in message


def test_component_facts_load_with_sources(tmp_path):
    text = GOOD.replace(
        '"9.2p1": {source: apt, options: {packages: [openssh-client]}}',
        '"9.2p1": {source: apt, os: [debian12], requires: ["python>=3.9"], '
        'sources: {os: "https://packages.debian.org/bookworm/openssh-server", '
        'requires: "https://example.org/build#deps"}, options: {packages: [openssh-client]}}')
    layer = load_text(tmp_path, text).stack("small").layers[0]
    assert layer.spec["os"] == ["debian12"] and layer.spec["requires"] == ["python>=3.9"]


def test_bad_requires_entry_is_named(tmp_path):
    text = GOOD.replace(
        '"9.2p1": {source: apt, options: {packages: [openssh-client]}}',
        '"9.2p1": {source: apt, requires: ["Open MPI"], sources: {requires: "https://x.org/y"}}')
    message = error_of(tmp_path, text)
    assert "stacks.yaml:11" in message and "requires" in message and "'Open MPI'" in message


# --- a stack's own options for a layer -------------------------------------------------------

TWO_STACKS = GOOD + """\
  own:
    description: the same layers, ssh with options of its own
    base: debian-12
    instances: [c5n.18xlarge]
    fabric: tcp
    layers:
      - ssh: {version: "9.2p1", options: {packages: [openssh-server]}}
      - entrypoint: "0.1.0"
"""


def test_a_stack_gives_a_layer_options_of_its_own_over_its_versions(tmp_path):
    matrix = load_text(tmp_path, TWO_STACKS)
    own, small = matrix.stack("own").layers[0], matrix.stack("small").layers[0]
    assert (own.component, own.version) == ("ssh", "9.2p1")
    assert own.spec["options"] == {"packages": ["openssh-server"]}
    assert own.spec["source"] == "apt"  # the rest of the version's entry, unchanged
    assert small.spec["options"] == {"packages": ["openssh-client"]}  # the version's own, shared


def test_a_stacks_layer_options_pass_the_components_schema(tmp_path):
    message = error_of(tmp_path, TWO_STACKS.replace("{packages: [openssh-server]}",
                                                    "{pakages: [openssh-server]}"))
    assert message.startswith(f"{tmp_path / 'stacks.yaml'}:31: stacks/own/layers/0/ssh/options: ")
    assert "unknown key(s) pakages" in message and "[images/ssh/options.schema.yaml]" in message
    message = error_of(tmp_path, TWO_STACKS.replace("[openssh-server]", "[]"))
    assert "stacks/own/layers/0/ssh/options/packages" in message and "\n" not in message


def test_a_layer_written_as_a_mapping_needs_its_version_and_options(tmp_path):
    message = error_of(tmp_path, TWO_STACKS.replace(
        '{version: "9.2p1", options: {packages: [openssh-server]}}', '{version: "9.2p1"}'))
    assert "stacks.yaml:31: stacks/own/layers/0/ssh" in message and "options" in message
    message = error_of(tmp_path, TWO_STACKS.replace('version: "9.2p1"', "version: 9.2"))
    assert "stacks/own/layers/0/ssh/version" in message and "expected string" in message

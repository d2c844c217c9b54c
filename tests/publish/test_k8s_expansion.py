"""The command in a generated manifest survives Kubernetes' dependent-variable expansion.

Before a container starts, the kubelet runs its ``command``, ``args`` and every env ``value``
through ``Expand`` (kubernetes/kubernetes pkg/kubelet/container/helpers.go,
``ExpandContainerCommandAndArgs``; pkg/kubelet/kubelet_pods.go, ``makeEnvironmentVariables``):
``$(NAME)`` becomes NAME's value when NAME is set, ``$$`` becomes ``$``. No kubelet runs here, so
``expand`` below is a line-by-line port of kubernetes/kubernetes
third_party/forked/golang/expansion/expand.go at commit
fde22c3f9aacfd260225a9741de123a41157b7c0: ``MappingFuncFor`` (line 23), ``Expand`` (line 39)
and ``tryReadVariableName`` (line 82). It works on UTF-8 bytes, as Go strings do; the one rune
decoded after a ``$`` is that commit's ``utf8.DecodeRuneInString`` (kubernetes PR 136325, which
fixed a ``$`` followed by a multi-byte character; before it the byte was read alone).
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from matrix.jobs.k8s import KINDS, k8s_literal
from tests.helpers import written

ROOT = Path(__file__).resolve().parents[2]
IMAGE = "123456789012.dkr.ecr.us-east-1.amazonaws.com/mnp/cuda@sha256:" + "b" * 64
OPERATOR, OPENER, CLOSER = ord("$"), ord("("), ord(")")


def mapping_func_for(*contexts: Mapping[str, str]) -> Callable[[str], str]:
    """``MappingFuncFor``: the first context's value, else the reference written back."""
    def mapping(name: str) -> str:
        for context in contexts:
            if name in context:
                return context[name]
        return "$(" + name + ")"
    return mapping


def decode_rune(data: bytes) -> tuple[bytes, int]:
    """``utf8.DecodeRuneInString``: the first rune's UTF-8 bytes and size; an invalid sequence
    is ``RuneError`` (U+FFFD) of size 1."""
    for size in (1, 2, 3, 4):
        try:
            data[:size].decode("utf-8")
        except UnicodeDecodeError:
            continue
        return data[:size], size
    return "\ufffd".encode(), 1


def try_read_variable_name(data: bytes) -> tuple[bytes, bool, int]:
    """``tryReadVariableName``: ``(read, is_var, advance)`` for the bytes after a ``$``."""
    if data[0] == OPERATOR:  # an escaped operator: return it
        return data[0:1], False, 1
    if data[0] == OPENER:  # scan to the closer
        for index in range(1, len(data)):
            if data[index] == CLOSER:
                return data[1:index], True, index + 1
        return b"$(", False, 1  # an incomplete reference: return it
    rune, size = decode_rune(data)  # not an expression: the operator and the first rune
    return b"$" + rune, False, size


def expand(text: str, mapping: Callable[[str], str]) -> str:
    """``Expand``: ``text`` after the kubelet's expansion."""
    data = text.encode("utf-8")
    out = bytearray()
    checkpoint = 0
    cursor = 0
    while cursor < len(data):
        if data[cursor] == OPERATOR and cursor + 1 < len(data):
            out += data[checkpoint:cursor]
            read, is_var, advance = try_read_variable_name(data[cursor + 1:])
            out += mapping(read.decode("utf-8")).encode("utf-8") if is_var else read
            cursor += advance
            checkpoint = cursor + 1
        cursor += 1
    return (bytes(out) + data[checkpoint:]).decode("utf-8")


POD_ENV = {"MNP_FABRIC": "tcp", "HOME": "/root", "PATH": "/usr/bin"}
KUBELET = mapping_func_for(POD_ENV)


@pytest.mark.parametrize(("text", "expanded"), [
    # the cases of kubernetes' own expand_test.go, against this port
    ("$(MNP_FABRIC)", "tcp"), ("$$(MNP_FABRIC)", "$(MNP_FABRIC)"), ("$$$$", "$$"),
    ("$(UNSET)", "$(UNSET)"), ("$(MNP_FABRIC", "$(MNP_FABRIC"), ("$", "$"), ("a$b", "a$b"),
    ("echo $$ $(MNP_FABRIC)", "echo $ tcp"), ("$(HOME)$(PATH)", "/root/usr/bin"),
    ("$é", "$é"), ("$(", "$("), ("$$", "$"),
])
def test_the_port_expands_as_the_kubelet_does(text, expanded):
    assert expand(text, KUBELET) == expanded


def test_the_issue_example_is_what_an_unescaped_command_would_get():
    # `-- bash -c 'echo $$ $(MNP_FABRIC)'` reached the container as `echo $ tcp` (issue 23)
    assert expand("echo $$ $(MNP_FABRIC)", KUBELET) == "echo $ tcp"
    assert expand(k8s_literal("echo $$ $(MNP_FABRIC)"), KUBELET) == "echo $$ $(MNP_FABRIC)"


WORDS = st.lists(st.one_of(
    st.sampled_from(["$", "$$", "$$$", "$(MNP_FABRIC)", "$(HOME)", "$(UNSET)", "$(", ")", "(",
                     "'", '"', " ", "\\", "\t", "é", "echo", "${HOME}", "$HOME", "$((1+2))"]),
    st.text(max_size=6)), max_size=12).map("".join)


@settings(max_examples=400, deadline=None)
@given(WORDS)
def test_escaped_text_expands_back_to_itself(text):
    assert expand(k8s_literal(text), KUBELET) == text


def _containers(manifest: dict) -> list[tuple[list[str], dict[str, str]]]:
    """``(args, env)`` of every container the manifest starts (TrainJob: the trainer's)."""
    spec = manifest["spec"]
    if manifest["kind"] == "TrainJob":
        found = [spec["trainer"]]
    else:
        replicas = spec.get("pytorchReplicaSpecs") or spec["mpiReplicaSpecs"]
        found = [c for r in replicas.values() for c in r["template"]["spec"]["containers"]]
    return [(c["args"], {e["name"]: e["value"] for e in c["env"]}) for c in found]


@settings(max_examples=60, deadline=None)
@given(st.lists(WORDS.filter(bool), min_size=1, max_size=4), st.sampled_from(sorted(KINDS)),
       WORDS)
def test_every_container_gets_the_command_and_env_as_typed(command, kind, value):
    """What ``invoke k8s`` writes for any command and the one env value a user types
    (``--launcher-args``, shell-quoted: the entrypoint splits it like a shell)."""
    typed = shlex.quote(value)
    manifest = written("k8s", "--kind", kind, "--stack", "cpu-tcp", "--nodes", "2",
                       "--instance-type", "c5n.18xlarge", "--image-uri", IMAGE,
                       "--launcher-args", typed, command=command)
    for args, env in _containers(manifest):
        kubelet = mapping_func_for(env)  # the container's own variables, as the kubelet uses
        assert [expand(word, kubelet) for word in args] == command
        assert expand(env["MNP_LAUNCHER_ARGS"], kubelet) == typed


def test_invoke_k8s_writes_args_the_container_gets_word_for_word(tmp_path):
    """The user's path: the issue's command through ``invoke k8s`` and the kubelet's expansion."""
    command = ["bash", "-c", "echo $$ $(MNP_FABRIC) \"$HOME\" '$((1+2))'"]
    target = tmp_path / "job.yaml"
    proc = subprocess.run(
        [sys.executable, "-m", "invoke", "k8s", "--kind", "pytorchjob", "--stack", "cpu-tcp",
         "--nodes", "2", "--instance-type", "c5n.18xlarge", "--image-uri", IMAGE, "--output",
         str(target), "--", *command], cwd=ROOT, capture_output=True, text=True, timeout=120,
        check=False, env={**os.environ, "DOCKER_HOST": "unix:///nonexistent/docker.sock"})
    assert proc.returncode == 0, proc.stderr
    ((args, env), *_) = _containers(yaml.safe_load(target.read_text()))
    assert args[2] == "echo $$$$ $$(MNP_FABRIC) \"$$HOME\" '$$((1+2))'"
    assert [expand(word, mapping_func_for(env)) for word in args] == command

"""Base image references follow Docker's reference grammar (distribution/reference regexp.go):
a registry with a port is a base like any other; a malformed reference is one line naming the
stacks file's line and the key."""

from __future__ import annotations

import pytest

from matrix.model import reference
from tests.test_loader import GOOD, error_of, load_text

DIGEST = "sha256:" + "0123456789abcdef" * 4


@pytest.mark.parametrize("ref", [
    "127.0.0.1:5000/team/cuda:12.8",
    "registry.internal:5000/base:1",
    "localhost:5000/debian",
    "[::1]:5000/team/cuda:12.8",
    "debian:bookworm",
    f"nvidia/cuda:12.1.1-cudnn8-devel-ubuntu22.04@{DIGEST}",
    f"127.0.0.1:5000/team/cuda@{DIGEST}",
    "vault.habana.ai/gaudi-docker/1.6.0/ubuntu20.04/habanalabs/pytorch-installer-1.12.0:1.6.0-439",
    "a__b/c---d.e:Tag_1.x-y",
])
def test_docker_references_load(tmp_path, ref):
    matrix = load_text(tmp_path, GOOD.replace("image: debian:bookworm", f"image: {ref!r}"))
    assert matrix.bases["debian-12"].image == ref


@pytest.mark.parametrize("ref, why", [
    ("Debian:12", "not an image reference"),          # upper case in a path component
    ("team//cuda:1", "not an image reference"),       # empty path component
    ("registry:port/cuda", "not an image reference"),  # a port is digits
    ("debian:", "not an image reference"),            # empty tag
    ("debian:a:b", "not an image reference"),
    ("debian:" + "t" * 129, "not an image reference"),  # tags are at most 128 characters
    ("debian@sha256:abc", "not an image reference"),  # a digest has at least 32 hex digits
    ("debian@md5:" + "0" * 32, "is not sha256"),
    ("a" * 256, "over Docker's 255"),
])
def test_malformed_reference_is_one_line_with_file_line_and_key(tmp_path, ref, why):
    message = error_of(tmp_path, GOOD.replace("image: debian:bookworm", f"image: {ref!r}"))
    assert message.startswith(f"{tmp_path / 'stacks.yaml'}:4: bases/debian-12/image: ")
    assert why in message
    assert "\n" not in message


def test_domain_follows_the_engines_rule():
    assert reference.parse("127.0.0.1:5000/team/cuda:12.8").domain == "127.0.0.1:5000"
    assert reference.parse("localhost/x").domain == "localhost"
    assert reference.parse("team/cuda:12.8").domain == ""  # Docker Hub's team/cuda
    parsed = reference.parse(f"registry.internal:5000/base:1@{DIGEST}")
    assert (parsed.name, parsed.tag, parsed.digest) == ("registry.internal:5000/base", "1", DIGEST)



"""The aws-ofi-nccl layer's two version checks read the plugin as the entrypoint's probe does.

The build's self-check (the last RUN of images/aws-ofi-nccl/Dockerfile.j2, run here as rendered
for each stack, with the install prefix moved under a temporary folder) and the layer test
(images/aws-ofi-nccl/test_aws_ofi_nccl.py, run here against this machine through testinfra's
local backend) get plugin files made for the purpose: one whose init message names the release,
and ones that carry the release only elsewhere (an install prefix), as a build from git does
("Initializing aws-ofi-nccl git-6e504db", entrypoint/probe/fabric.py). The probe finds no release
in those, so both checks must refuse them; ``grep -qa VERSION`` anywhere in the file did not.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
from pathlib import Path

import pytest
import testinfra

from entrypoint.probe import fabric
from tests.helpers import project_matrix, project_plan
from tests.test_dockerfile_env import instructions

ROOT = Path(__file__).resolve().parent.parent
LAYER_TEST = ROOT / "images" / "aws-ofi-nccl" / "test_aws_ofi_nccl.py"


def plugin_layers() -> list[tuple[str, str, str, str]]:
    """(stack, version, install prefix, rendered Dockerfile) of each aws-ofi-nccl layer built."""
    matrix, result = project_matrix(), project_plan()
    found = {}
    for stack in result.chains:
        for layer in result.chain(stack):
            if layer.component == "aws-ofi-nccl" and layer.version not in found:
                spec = matrix.stack(stack).layer("aws-ofi-nccl").spec
                found[layer.version] = (stack, layer.version, spec["options"]["prefix"],
                                        layer.dockerfile)
    return sorted(found.values())


LAYERS = plugin_layers()


def plugins(version: str) -> dict[str, bytes]:
    """Plugin files: what a release build embeds, and what a git build with the release's
    number elsewhere does."""
    elf = b"\x7fELF\x02\x01\x01\x00" + b"\x00" * 56
    prefix = f"/opt/aws-ofi-nccl-{version}/share/aws-ofi-nccl/xml\x00".encode()
    return {
        "release": elf + prefix + f"NET/OFI\x00Initializing aws-ofi-nccl {version}-aws\x00".encode(),
        "git build": elf + prefix + b"Initializing aws-ofi-nccl git-6e504db\x00",
        "no init message": elf + prefix + f"aws-ofi-nccl {version}\x00".encode(),
    }


def release_of(version: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.match(r"(\d+)\.(\d+)\.(\d+)", version).groups())


def install(folder: Path, prefix: str, content: bytes) -> Path:
    lib = folder / prefix.lstrip("/") / "lib" / "libnccl-net.so"
    lib.parent.mkdir(parents=True)
    lib.write_bytes(content)
    return lib


def self_check(dockerfile: str, prefix: str, moved: Path) -> subprocess.CompletedProcess:
    """The layer's last RUN (its self-check) as rendered, the prefix moved under ``moved``, in
    bash with pipefail (the layer's SHELL)."""
    runs = [arguments for keyword, arguments in instructions(dockerfile) if keyword == "RUN"]
    check = runs[-1]
    assert "libnccl-net.so" in check, check
    script = check.replace(prefix, str(moved / prefix.lstrip("/")))
    return subprocess.run(["bash", "-o", "pipefail", "-c", script], capture_output=True,
                          text=True, check=False)


def layer_test():
    spec = importlib.util.spec_from_file_location("mnp_layer_test_aws_ofi_nccl", LAYER_TEST)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.test_plugin_present_with_version


def test_every_plugin_layer_is_checked():
    assert {version for _, version, _, _ in LAYERS} >= {"1.6.0", "1.7.4", "1.12.1"}


@pytest.mark.parametrize("stack, version, prefix, dockerfile", LAYERS,
                         ids=[version for _, version, _, _ in LAYERS])
def test_the_probe_reads_the_made_plugins_as_meant(stack, version, prefix, dockerfile, tmp_path):
    for kind, content in plugins(version).items():
        lib = install(tmp_path / kind.replace(" ", "-"), prefix, content)
        release, _ = fabric.plugin_version(str(lib))
        assert release == (release_of(version) if kind == "release" else None), kind


@pytest.mark.parametrize("stack, version, prefix, dockerfile", LAYERS,
                         ids=[version for _, version, _, _ in LAYERS])
def test_the_builds_self_check_reads_the_init_message(stack, version, prefix, dockerfile,
                                                      tmp_path):
    for kind, content in plugins(version).items():
        moved = tmp_path / kind.replace(" ", "-")
        install(moved, prefix, content)
        proc = self_check(dockerfile, prefix, moved)
        if kind == "release":
            assert proc.returncode == 0, f"{stack}: {proc.stderr}"
        else:
            assert proc.returncode != 0, f"{stack}: the self-check passed a {kind}"
            assert f"aws-ofi-nccl {version}: the plugin's init message names" in proc.stderr


@pytest.mark.parametrize("stack, version, prefix, dockerfile", LAYERS,
                         ids=[version for _, version, _, _ in LAYERS])
def test_the_layer_test_reads_the_init_message(stack, version, prefix, dockerfile, tmp_path):
    check = layer_test()
    host = testinfra.get_host("local://")
    for kind, content in plugins(version).items():
        moved = tmp_path / kind.replace(" ", "-")
        install(moved, prefix, content)
        layer = {"version": version, "spec": {"options": {"prefix": str(moved / prefix.lstrip("/"))}}}
        if kind == "release":
            check(host, layer)
        else:
            with pytest.raises(AssertionError):
                check(host, layer)

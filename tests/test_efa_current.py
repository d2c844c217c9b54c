"""Issue 25: the current EFA stack (cuda13.2-efa1.51) and what every EFA layer with a bundled
aws-ofi-nccl plugin does at build time (find the plugin's directory, set NCCL_NET_PLUGIN)."""

from __future__ import annotations

from pathlib import Path

import pytest

from matrix.image.plan import plan
from matrix.model.loader import load_matrix
from matrix.model.rules import check_stack
from tests.helpers import stacks_yaml

ROOT = Path(__file__).resolve().parent.parent
DATA = stacks_yaml()
GENERATED = ROOT / "images" / "generated"
STACK = "cuda13.2-efa1.51"

# The EFA release notes' 1.51.0 row (efa-changelog.html, October 22, 2026), as data.
EFA_1_51_ROW = {"libfabric": "2.7.0amzn2.0", "aws-ofi-nccl": "1.22.0", "rdma-core": "65.0",
                "drops": "Debian 11"}
# Where the bundled plugin may be, by platform: the Debian multiarch folder of its architecture
# (installers up to 1.47; aarch64 on arm64, AWS's nccl-tests.Dockerfile), RPM's lib64, and lib
# (installers from 1.48 on both).
PLUGIN_DIRS = {
    "linux/amd64": ("/opt/amazon/ofi-nccl/lib/x86_64-linux-gnu", "/opt/amazon/ofi-nccl/lib64",
                    "/opt/amazon/ofi-nccl/lib"),
    "linux/arm64": ("/opt/amazon/ofi-nccl/lib/aarch64-linux-gnu", "/opt/amazon/ofi-nccl/lib64",
                    "/opt/amazon/ofi-nccl/lib"),
}


def _version(component: str, version: str) -> dict:
    return DATA["components"][component]["versions"][version]


def _flat(text: str) -> str:
    return " ".join(text.split())


def _layer(stack: str, component: str) -> str:
    return next((GENERATED / stack).glob(f"*-{component}.Dockerfile")).read_text(encoding="utf-8")


def test_efa_1_51_0_is_the_release_notes_row():
    spec = _version("efa", "1.51.0")
    assert spec["provides"]["libfabric"] == EFA_1_51_ROW["libfabric"]
    assert spec["provides"]["aws-ofi-nccl"] == EFA_1_51_ROW["aws-ofi-nccl"]
    notes = _flat(spec["notes"])
    assert f"rdma-core {EFA_1_51_ROW['rdma-core']}" in notes and "October 22, 2026" in notes
    assert "debian11" not in spec["os"] and "debian12" in spec["os"]
    assert EFA_1_51_ROW["drops"] in spec["sources"]["os"]


def test_no_checksum_is_invented_for_what_could_not_be_fetched():
    """efa-installer.amazonaws.com and GitHub were unreachable and no published sha256 was
    found: both versions name their archive and carry no `download`, so they fail closed."""
    for component, version, url in (
            ("efa", "1.51.0", "https://efa-installer.amazonaws.com/aws-efa-installer-1.51.0.tar.gz"),
            ("nccl-tests", "2.18.3", "https://github.com/NVIDIA/nccl-tests/archive/v2.18.3.tar.gz")):
        spec = _version(component, version)
        assert "download" not in spec and spec["options"]["archive_url"] == url
        assert "UNVERIFIED PIN, fails closed" in spec["notes"]
        text = _layer(STACK, component)
        assert "exit 1" in text and url in text and "invoke pin --check" in text
        assert "sha256sum -c" not in text and "curl" not in text


def test_the_current_stack_is_valid_but_not_buildable_yet():
    matrix = load_matrix(ROOT / "stacks.yaml")
    stack = matrix.stack(STACK)
    assert not [v for v in check_stack(stack) if v.blocking]
    assert stack.unpinned() == ["efa 1.51.0", "nccl-tests 2.18.3"]
    assert "p5e.48xlarge" in stack.instances


def test_the_current_stack_shares_every_layer_below_the_fabric_with_cuda13_2_efa():
    matrix = load_matrix(ROOT / "stacks.yaml")
    result = plan(matrix, ["cuda13.2-efa", STACK])
    old, new = result.chain("cuda13.2-efa"), result.chain(STACK)
    fabric = [x.component for x in old].index("efa")
    assert fabric == [x.component for x in new].index("efa") == 7
    assert [x.ref for x in old[:fabric]] == [x.ref for x in new[:fabric]]
    assert old[fabric].ref != new[fabric].ref


def test_nccl_stays_the_one_pytorch_pins():
    """torch 2.15.0 requires nvidia-nccl-cu13==2.30.7; NCCL 2.32.3 (on PyPI) is not forced
    under it, the description says why."""
    stack = DATA["stacks"][STACK]
    assert {"nccl": "2.30.7"} in stack["layers"]
    torch_nccl = _version("pytorch", "2.15.0")["pip"]["nvidia-nccl-cu13"]["version"]
    assert torch_nccl == "2.30.7"
    assert "pytorch/pytorch/pull/194253" in _flat(stack["description"])


@pytest.mark.parametrize(("stack", "platform"), [("cuda13.2-efa", "linux/amd64"),
                                                  ("cuda13.2-efa-arm64", "linux/arm64")])
def test_a_bundled_plugin_installer_sets_nccl_net_plugin_and_finds_the_plugin(stack, platform):
    """NGC bases default NCCL_NET_PLUGIN=spcx; NCCL then never opens libnccl-net.so, so the
    EFA layer names the plugin itself, and checks at build time where the installer put it:
    the multiarch folder of the stack's platform, not the other's."""
    text = _layer(stack, "efa")
    assert "NCCL_NET_PLUGIN=ofi" in text
    assert "Megatron-Bridge" not in text  # the why lives in the template, not the output
    library_path = text.split("LD_LIBRARY_PATH=", 1)[1].split("\n", 1)[0]
    for directory in PLUGIN_DIRS[platform]:
        assert directory in library_path
    assert f"case \"$plugin_dir\" in {'|'.join(PLUGIN_DIRS[platform])})" in text
    other = next(dirs[0] for name, dirs in PLUGIN_DIRS.items() if name != platform)
    assert other not in text
    assert 'echo "$plugin_dir" > /etc/ld.so.conf.d/aws-ofi-nccl.conf && ldconfig' in text
    assert 'test -e "$plugin_dir/libnccl-net-${NCCL_NET_PLUGIN}.so"' in text


def test_an_installer_without_the_plugin_leaves_nccl_net_plugin_alone():
    """Before 1.38.0 the plugin is its own layer (libnccl-net.so): nothing to name."""
    text = _layer("cuda12.1-efa", "efa")
    assert "NCCL_NET_PLUGIN" not in text and "ofi-nccl" not in text


def test_the_template_says_why_with_its_sources():
    template = (ROOT / "images" / "efa" / "Dockerfile.j2").read_text(encoding="utf-8")
    flat = _flat(template)
    assert "src/plugin/net.cc" in flat and "src/plugin/plugin_open.cc" in flat
    assert "NVIDIA-NeMo/Megatron-Bridge pull 5033" in flat
    assert "NCCL_NET_PLUGIN=spcx" in flat

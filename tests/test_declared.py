"""``matrix.image.declared``: what a stack's image holds, read from its templates' ``installs``
and its rendered ENV lines (the facts ``invoke explain`` plans with); the built images are
checked against it in tests/integration/test_declared_image.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from matrix.image.declared import DOCKER_DEFAULT_PATH, env_instructions, image_facts, on_path
from tests.helpers import project_matrix

ROOT = Path(__file__).resolve().parent.parent
MATRIX = project_matrix()


def test_env_is_the_last_stages_with_earlier_values_expanded():
    dockerfile = ("FROM a AS builder\nENV PATH=/build/bin:$PATH\n"
                  "FROM b\nENV PATH=/opt/x/bin:$PATH \\\n    LD_LIBRARY_PATH=/opt/x/lib:${LD_LIBRARY_PATH}\n"
                  'ENV NOTE "two words"\nENV A=1 B=$A\nENV C=$A\n')
    found = env_instructions(dockerfile, {"PATH": "/usr/bin"})
    # B: one instruction sees the variables as they were before it (Docker's "Environment
    # replacement"); C: a later one sees A
    assert found == {"PATH": "/opt/x/bin:/usr/bin", "LD_LIBRARY_PATH": "/opt/x/lib:",
                     "NOTE": "two words", "A": "1", "B": "", "C": "1"}


def test_a_program_two_layers_install_is_the_one_first_on_path():
    assert on_path(["/usr/bin/mpirun", "/opt/amazon/openmpi/bin/mpirun"],
                   "/opt/amazon/openmpi/bin:/usr/bin") == "/opt/amazon/openmpi/bin/mpirun"
    assert on_path(["/usr/bin/mpirun", "/opt/x/mpirun"], "/usr/bin") == "/usr/bin/mpirun"


@pytest.mark.parametrize("stack, name, path", [
    ("cpu-tcp", "torchrun", "/usr/bin/torchrun"),  # Debian's python3-torch
    ("cuda13.2-tcp", "torchrun", "/usr/local/bin/torchrun"),  # the pip wheel's console script
    ("cuda10.1-tcp", "mpirun", "/opt/openmpi/bin/mpirun"),  # openmpi options.prefix
    ("cuda11.7-efa", "mpirun", "/opt/amazon/openmpi/bin/mpirun"),  # the EFA installer's
    ("cuda10.1-tcp", "torchrun", None),  # PyTorch 1.4 has none (console script from 1.10.0)
])
def test_each_program_is_where_its_template_installs_it(stack, name, path):
    assert image_facts(MATRIX, MATRIX.stack(stack)).programs.get(name) == path


def test_plugins_library_folders_and_environment_follow_the_layers():
    efa = image_facts(MATRIX, MATRIX.stack("cuda13.2-efa"))  # the installer's bundled plugin
    assert efa.plugin == "/opt/amazon/ofi-nccl/lib/libnccl-net.so" and efa.fi_info_efa is True
    assert efa.libdirs == ["/opt/amazon/efa/lib", "/opt/amazon/openmpi/lib"]
    assert efa.env["NCCL_NET_PLUGIN"] == "ofi" and efa.env["PYTHONPATH"] == "/opt/mnp/lib"
    # arm64 (p6e-gb200): installer 1.50.0's plugin is in lib as on amd64; the multiarch folder
    # on the library path is aarch64's, rendered with the stack's platform
    arm = image_facts(MATRIX, MATRIX.stack("cuda13.2-efa-arm64"))
    assert arm.plugin == efa.plugin and arm.fi_info_efa is True
    arm_path = arm.env["LD_LIBRARY_PATH"].split(":")
    assert "/opt/amazon/ofi-nccl/lib/aarch64-linux-gnu" in arm_path
    assert "/opt/amazon/ofi-nccl/lib/x86_64-linux-gnu" not in arm_path
    assert "/opt/amazon/ofi-nccl/lib/x86_64-linux-gnu" in efa.env["LD_LIBRARY_PATH"].split(":")
    own = image_facts(MATRIX, MATRIX.stack("cuda11.7-efa"))  # its own aws-ofi-nccl layer
    assert own.plugin == "/opt/aws-ofi-nccl/lib/libnccl-net.so"
    gaudi = image_facts(MATRIX, MATRIX.stack("synapseai1.6-efa"))
    assert gaudi.hccl_wrapper == "/usr/lib/habanalabs/libhccl_ofi_wrapper.so"
    cpu = image_facts(MATRIX, MATRIX.stack("cpu-tcp"))
    assert cpu.env["PATH"] == DOCKER_DEFAULT_PATH and cpu.plugin is None
    assert cpu.fi_info_efa is None and cpu.libdirs == []

"""Layer test: the Habana base is the SynapseAI release, PyTorch and EFA installer declared."""


def test_synapseai_release(host, layer):
    pkg = host.package(layer["spec"]["options"]["graph_package"])
    assert pkg.is_installed
    assert pkg.version.startswith(f"{layer['version']}-{layer['spec']['options']['build']}")


def test_habana_pytorch(host, layer):
    out = host.check_output(
        "python3 -c 'import torch, habana_frameworks.torch.core; print(torch.__version__)'")
    assert out.startswith(layer["spec"]["provides"]["pytorch"])


def test_efa_installer_and_mpi(host, layer):
    assert f"EFA installer version: {layer['spec']['provides']['efa']}" in \
        host.file("/opt/amazon/efa_installed_packages").content_string
    assert host.run("fi_info --version").rc == 0
    assert host.check_output("command -v mpirun") == "/opt/amazon/openmpi/bin/mpirun"

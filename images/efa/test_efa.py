"""Layer test: the EFA installer's libfabric and Open MPI."""


def test_installer_version_recorded(host, layer):
    assert f"EFA installer version: {layer['version']}" in \
        host.file("/opt/amazon/efa_installed_packages").content_string


def test_libfabric_version_and_efa_provider(host, layer):
    out = host.check_output("fi_info --version")
    assert f"libfabric: {layer['spec']['provides']['libfabric']}" in out
    assert host.file("/opt/amazon/efa/lib/libfabric.so").exists


def test_open_mpi_version(host, layer):
    assert f"v{layer['spec']['provides']['openmpi']}" in host.check_output("ompi_info --version")
    assert host.check_output("command -v mpirun") == "/opt/amazon/openmpi/bin/mpirun"


def test_installer_removed(host):
    assert not host.file("/tmp/aws-efa-installer.tar.gz").exists
    assert not host.file("/tmp/aws-efa-installer/efa_installer.sh").exists

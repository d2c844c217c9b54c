"""Layer test: the EFA installer's libfabric and Open MPI (and its bundled aws-ofi-nccl plugin)."""


def plugin_dirs(host):
    """Where installers put the bundled plugin, by package layout (images/efa/Dockerfile.j2):
    the Debian multiarch folder of the image's architecture, RPM's lib64, and lib. Debian's
    tuples for amd64 and arm64 are the kernel's machine name and -linux-gnu (x86_64-linux-gnu,
    aarch64-linux-gnu: https://wiki.debian.org/Multiarch/Tuples), so the container says which."""
    machine = host.check_output("uname -m")
    return (f"/opt/amazon/ofi-nccl/lib/{machine}-linux-gnu", "/opt/amazon/ofi-nccl/lib64",
            "/opt/amazon/ofi-nccl/lib")


def test_installer_version_recorded(host, layer):
    assert f"EFA installer version: {layer['version']}" in \
        host.file("/opt/amazon/efa_installed_packages").content_string


def test_libfabric_version_and_efa_provider(host, layer):
    out = host.check_output("fi_info --version")
    assert f"libfabric: {layer['spec']['provides']['libfabric']}" in out
    assert host.file("/opt/amazon/efa/lib/libfabric.so").exists


def test_open_mpi_version(host, layer):
    expected = layer["spec"]["provides"].get("openmpi")
    out = host.check_output("ompi_info --version")
    assert f"v{expected}" in out if expected else "Open MPI" in out
    assert host.check_output("command -v mpirun") == "/opt/amazon/openmpi/bin/mpirun"


def test_installer_removed(host):
    assert not host.file("/tmp/aws-efa-installer.tar.gz").exists
    assert not host.file("/tmp/aws-efa-installer/efa_installer.sh").exists


def _bundled_plugin(host, layer):
    """The installer's own plugin, found where this layer found it at build time (None: older
    installers, whose plugin is its own layer)."""
    if layer["spec"]["provides"].get("aws-ofi-nccl") is None:
        return None
    plugin = host.check_output("find /opt/amazon/ofi-nccl -name libnccl-net-ofi.so -print -quit")
    assert plugin, "no libnccl-net-ofi.so under /opt/amazon/ofi-nccl"
    return plugin


def test_bundled_plugin_when_provided(host, layer):
    plugin = _bundled_plugin(host, layer)
    if plugin is None:
        return
    assert host.run(f"grep -qa {layer['spec']['provides']['aws-ofi-nccl']} {plugin}").rc == 0
    assert "not found" not in host.check_output(f"ldd {plugin} | grep -v libcuda.so || true")


def test_bundled_plugin_path_is_where_nccl_looks(host, layer):
    """The plugin's directory differs by package layout; the build found it: it must be one of
    the three layouts of its architecture, on the image's LD_LIBRARY_PATH and in the linker
    configuration, and NCCL_NET_PLUGIN must name it (a base's NCCL_NET_PLUGIN=spcx would hide it
    from NCCL)."""
    plugin = _bundled_plugin(host, layer)
    if plugin is None:
        return
    directory = plugin.rsplit("/", 1)[0]
    assert directory in plugin_dirs(host), plugin
    assert directory in host.run("printenv LD_LIBRARY_PATH").stdout.strip().split(":")
    assert host.file("/etc/ld.so.conf.d/aws-ofi-nccl.conf").content_string.split() == [directory]
    name = host.run("printenv NCCL_NET_PLUGIN").stdout.strip()
    assert name == "ofi", name
    assert host.file(f"{directory}/libnccl-net-{name}.so").exists

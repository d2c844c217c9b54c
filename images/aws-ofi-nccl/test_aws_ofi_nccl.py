"""Layer test: the aws-ofi-nccl plugin is present, versioned and linkable; no compilers left.

The version is read as the entrypoint's probe reads it at run time (``plugin_version`` in
entrypoint/probe/fabric.py: the release named by the plugin's init message), so a plugin the
probe would find no release in fails here, whatever other version strings the file holds.
"""

import re
import tempfile
from pathlib import Path

from entrypoint.probe import fabric


def _lib(layer):
    return f"{layer['spec']['options']['prefix']}/lib/libnccl-net.so"


def test_plugin_present_with_version(host, layer):
    lib = host.file(_lib(layer))
    assert lib.exists
    with tempfile.TemporaryDirectory(prefix="mnp-plugin-") as tmp:
        copy = Path(tmp) / "libnccl-net.so"
        copy.write_bytes(lib.content)
        release, said = fabric.plugin_version(str(copy))
    expected = tuple(int(x) for x in re.match(r"(\d+)\.(\d+)\.(\d+)", layer["version"]).groups())
    assert release == expected, said


def test_plugin_links_against_efa_libfabric(host, layer):
    out = host.check_output(f"ldd {_lib(layer)}")
    missing = [line for line in out.splitlines()
               if "not found" in line and "libcuda.so" not in line]
    assert not missing, missing
    assert "/opt/amazon/efa/lib" in out


def test_plugin_on_library_path(host, layer):
    path = host.check_output("bash -lc 'echo $LD_LIBRARY_PATH'")
    assert f"{layer['spec']['options']['prefix']}/lib" in path


def test_no_builder_tools_left(host):
    for tool in ("autoreconf", "automake", "libtoolize"):
        assert not host.exists(tool), tool
    assert not host.file("/tmp/aws-ofi-nccl").exists or not host.file("/tmp/aws-ofi-nccl").listdir()

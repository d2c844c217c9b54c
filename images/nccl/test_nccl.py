"""Layer test: NCCL, from apt or compiled (no build leftovers, no autotools)."""

import re


def _header(layer):
    prefix = layer["spec"].get("options", {}).get("prefix")
    if layer["spec"]["source"] == "download":
        return f"{prefix}/include/nccl.h"
    return "/usr/include/nccl.h"


def test_header_reports_the_version(host, layer):
    text = host.file(_header(layer)).content_string
    parts = [re.search(rf"#define NCCL_{k} (\d+)", text).group(1)
             for k in ("MAJOR", "MINOR", "PATCH")]
    assert ".".join(parts) == layer["version"]


def test_library_links(host, layer):
    if layer["spec"]["source"] == "download":
        lib = f"{layer['spec']['options']['prefix']}/lib/libnccl.so.2"
    else:
        lib = host.check_output("ldconfig -p | awk '/libnccl.so.2 /{print $NF; exit}'")
    assert host.file(lib).exists
    assert "not found" not in host.check_output(f"ldd {lib}")


def test_no_build_leftovers(host):
    assert not host.file("/tmp/nccl").exists or not host.file("/tmp/nccl").listdir()
    assert not host.exists("autoreconf")

"""Layer test: CUDA toolkit and cuDNN from NVIDIA's apt repository."""

import re


def test_nvcc_reports_the_pinned_release(host, layer):
    out = host.check_output("nvcc --version")
    assert f"V{layer['spec']['provides']['cuda']}" in out


def test_cudnn_header_matches(host, layer):
    header = host.file("/usr/include/cudnn.h").content_string
    parts = [re.search(rf"#define CUDNN_{k} (\d+)", header).group(1)
             for k in ("MAJOR", "MINOR", "PATCHLEVEL")]
    assert ".".join(parts) == ".".join(layer["spec"]["provides"]["cudnn"].split(".")[:3])


def test_packages_at_pinned_versions(host, layer):
    for name, version in layer["spec"]["apt"].items():
        assert host.package(name).version == version, name


def test_cudart_resolves_through_the_linker_cache(host):
    assert "libcudart.so" in host.check_output("ldconfig -p")


def test_repository_key_is_nvidias(host, layer):
    out = host.check_output("gpg --batch --with-colons --no-default-keyring "
                            "--keyring /usr/share/keyrings/nvidia-cuda.gpg --list-keys")
    assert layer["spec"]["options"]["key_fingerprint"] in out

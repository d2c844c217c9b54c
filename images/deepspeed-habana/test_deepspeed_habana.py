"""Layer test: Habana's DeepSpeed fork imports against Habana's PyTorch; pins as declared."""


def test_deepspeed_imports_with_habana_torch(host):
    out = host.check_output(
        "python3 -c 'import habana_frameworks.torch.core, deepspeed; print(deepspeed.__file__)'")
    assert "deepspeed" in out


def test_dependencies_pinned(host, layer):
    for name, pin in layer["spec"]["pip"].items():
        out = host.check_output(f"python3 -m pip show {name}")
        assert f"Version: {pin['version']}" in out, name


def test_source_archive_removed(host):
    assert not host.file("/tmp/deepspeed-habana.tar.gz").exists

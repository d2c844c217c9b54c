"""Layer test: Horovod version, its torch extension links MPI and NCCL; built wheel cleaned up."""


def test_version(host, layer):
    out = host.check_output("python3 -c 'import horovod; print(horovod.__version__)'")
    assert out == layer["version"]


def test_torch_extension_links(host):
    ext = host.check_output(
        "python3 -c 'import glob, os, horovod; "
        "print(glob.glob(os.path.dirname(horovod.__file__) + \"/torch/mpi_lib_v2*.so\")[0])'")
    out = host.check_output(f"ldd {ext}")
    assert "libmpi.so" in out and "libnccl.so" in out
    missing = [line for line in out.splitlines()
               if "not found" in line and "libcuda.so" not in line]
    assert not missing, missing


def test_runtime_dependencies_pinned(host, layer):
    for name, pin in layer["spec"].get("pip", {}).items():
        out = host.check_output(f"python3 -m pip show {name}")
        assert f"Version: {pin['version']}" in out, name


def test_no_wheel_or_builder_left(host):
    assert not host.file("/tmp/horovod-wheels").exists
    assert not host.file("/wheels").exists
    assert not host.file("/tmp/horovod").exists

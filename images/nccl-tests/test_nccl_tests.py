"""Layer test: nccl-tests binaries on PATH, linked to the image's NCCL and MPI."""


def test_binaries_link_to_image_nccl_and_mpi(host, layer):
    binary = host.check_output("command -v all_reduce_perf")
    assert binary == f"{layer['spec']['options']['prefix']}/bin/all_reduce_perf"
    out = host.check_output(f"ldd {binary}")
    assert f"{layer['spec']['options']['nccl_home']}/lib/libnccl.so" in out
    if layer["spec"]["options"].get("mpi", True):
        assert f"{layer['spec']['options']['mpi_home']}/lib/libmpi.so" in out
    missing = [line for line in out.splitlines()
               if "not found" in line and "libcuda.so" not in line]
    assert not missing, missing


def test_no_sources_or_compilers_left(host):
    assert not host.file("/tmp/nccl-tests").exists or not host.file("/tmp/nccl-tests").listdir()
    assert not host.exists("autoreconf")

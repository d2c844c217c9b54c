"""A pip-installed NCCL (NVIDIA's ``nvidia-nccl-cuXX`` wheel: the CUDA 13.2 stacks' nccl layer)
ships a bare ``libnccl.so.2``: the node finds its version from the wheel's dist-info, as
``invoke explain`` declares it from stacks.yaml, instead of planning with an unknown NCCL."""

from entrypoint.probe import facts

SITE = "usr/local/lib/python3.11/dist-packages"


def test_the_wheels_version_when_no_library_file_names_one(tmp_path):
    (tmp_path / "opt/nccl/lib").mkdir(parents=True)
    (tmp_path / "opt/nccl/lib/libnccl.so.2").write_text("")  # the nccl layer's link target
    (tmp_path / SITE / "nvidia_nccl_cu13-2.30.7.dist-info").mkdir(parents=True)
    version, where = facts.nccl_version(str(tmp_path))
    assert version == "2.30.7" and where.endswith("nvidia_nccl_cu13-2.30.7.dist-info")


def test_a_library_file_that_names_its_version_comes_first(tmp_path):
    (tmp_path / "opt/nccl/lib").mkdir(parents=True)
    (tmp_path / "opt/nccl/lib/libnccl.so.2.21.5").write_text("")
    (tmp_path / SITE / "nvidia_nccl_cu12-2.20.5.dist-info").mkdir(parents=True)
    assert facts.nccl_version(str(tmp_path))[0] == "2.21.5"


def test_no_nccl_at_all_is_unknown(tmp_path):
    (tmp_path / SITE / "torch-2.3.1.dist-info").mkdir(parents=True)
    assert facts.nccl_version(str(tmp_path)) == (None, None)

"""DeepSpeed layer: version equals the matrix, imports with the image's torch, no pip cache."""


def test_version(host, layer):
    out = host.check_output("python3 -c 'import deepspeed; print(deepspeed.__version__)'")
    assert out.splitlines()[-1] == layer["version"]


def test_accelerator_and_launcher(host):
    out = host.run("python3 -c 'from deepspeed.accelerator import get_accelerator; "
                   "print(get_accelerator().communication_backend_name())'")
    assert out.rc == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] in ("gloo", "nccl", "ccl", "hccl")
    assert host.exists("deepspeed")


def test_pip_left_no_cache_or_requirements(host):
    assert not host.file("/tmp/requirements.txt").exists
    assert host.run("find / -xdev -type d -path '*/.cache/pip' 2>/dev/null").stdout.strip() == ""

"""Python layer: interpreter version equals the matrix; pip works and left no cache."""


def test_python_version(host, layer):
    out = host.check_output("python3 -c 'import platform; print(platform.python_version())'")
    assert out == layer["version"]


def test_pip_runs(host):
    assert host.run("python3 -m pip --version").rc == 0


def test_no_pip_cache(host):
    out = host.run("find / -xdev -type d -path '*/.cache/pip' 2>/dev/null")
    assert out.stdout.strip() == ""

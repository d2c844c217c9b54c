"""Python layer: interpreter version equals the matrix; pip works (or, with ``options.pip``
false, is absent) and left no cache."""


def test_python_version(host, layer):
    out = host.check_output("python3 -c 'import platform; print(platform.python_version())'")
    assert out == layer["version"]


def test_pip_as_the_options_say(host, layer):
    if layer["spec"].get("options", {}).get("pip", True):
        assert host.run("python3 -m pip --version").rc == 0
    else:  # no module pip at all, not only no pip command
        probe = "import importlib.util, sys; sys.exit(importlib.util.find_spec('pip') is not None)"
        assert host.run(f'python3 -c "{probe}"').rc == 0, "options.pip is false, yet pip is there"


def test_no_pip_cache(host):
    out = host.run("find / -xdev -type d -path '*/.cache/pip' 2>/dev/null")
    assert out.stdout.strip() == ""

"""Entrypoint layer: installed as the image's ENTRYPOINT and importable by the image's Python."""


def test_launcher_installed(host):
    f = host.file("/usr/local/bin/mnp-entrypoint")
    assert f.exists and f.mode & 0o111


def test_package_imports_with_image_python(host):
    out = host.run("PYTHONPATH=/opt/mnp/lib python3 -c 'import entrypoint, sys; print(sys.version)'")
    assert out.rc == 0, out.stderr


def test_single_node_dry_run(host):
    # Without the Batch variables the entrypoint runs in single-node mode; dry-run prints a plan.
    out = host.run("MNP_DRY_RUN=1 /usr/local/bin/mnp-entrypoint python3 -c 'print(1)'")
    assert out.rc == 0, out.stderr
    assert "python3" in out.stdout + out.stderr

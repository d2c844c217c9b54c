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


def test_no_command_exits_2_saying_how_to_give_one(host):
    # The image has no CMD (issue 16): a job definition without a command must fail, on every
    # node, with one line that says where the command goes.
    for env in ("", "AWS_BATCH_JOB_NODE_INDEX=1 AWS_BATCH_JOB_MAIN_NODE_INDEX=0 "
                    "AWS_BATCH_JOB_NUM_NODES=2 AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS=10.0.0.9"):
        out = host.run(f"{env} /usr/local/bin/mnp-entrypoint")
        assert out.rc == 2, out.stdout + out.stderr
        errors = [line for line in out.stderr.splitlines() if "error" in line]
        assert len(errors) == 1 and "no command given" in errors[0], out.stderr
        assert "containerProperties.command" in errors[0] and "invoke jobdef" in errors[0]

"""Entrypoint layer: installed as the image's ENTRYPOINT and importable by the image's Python."""

import shlex


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


# Every module's bytecode, valid for the image's python3 (its magic number, and for timestamp
# bytecode the source's mtime and size; Python 3.6's header has no flags word): a container
# that had to compile the package would spend that CPU at every start, on every node.
BYTECODE_CHECK = r"""
import importlib.util, os, struct, sys
stale = []
for folder, _, names in os.walk('/opt/mnp/lib/entrypoint'):
    for name in names:
        if not name.endswith('.py'):
            continue
        source = os.path.join(folder, name)
        try:
            with open(importlib.util.cache_from_source(source), 'rb') as f:
                header = f.read(16)
        except OSError:
            stale.append(source + ' (none)')
            continue
        flags, fields = (0, header[4:12]) if sys.version_info < (3, 7) else \
            (struct.unpack('<I', header[4:8])[0], header[8:16])
        found = os.stat(source)
        timestamp = struct.unpack('<II', fields)
        if header[:4] != importlib.util.MAGIC_NUMBER or (
                flags == 0 and timestamp != (int(found.st_mtime) & 0xFFFFFFFF,
                                             found.st_size & 0xFFFFFFFF)):
            stale.append(source)
print('\n'.join(stale))
"""


def test_every_module_is_compiled_for_the_image_python(host):
    out = host.run(f"python3 -c {shlex.quote(BYTECODE_CHECK)}")
    assert out.rc == 0, out.stderr
    assert out.stdout.strip() == "", f"no valid bytecode: {out.stdout}"

"""Issue 16 item 3 in real containers of the ``cpu-tcp`` image: two 2-node jobs on an EFA plan
(``MNP_FABRIC=efa``) whose EFA cannot work stop on every node before sshd, the rendezvous or any
rank, with one line naming what is missing:

1. a GPU node (a stand-in ``nvidia-smi`` lists 8 GPUs) whose aws-ofi-nccl plugin was linked
   against a library that is not there (built on this host, the library then deleted, mounted at
   ``/opt/aws-ofi-nccl/lib``); ``fi_info -p efa`` is a stand-in that succeeds, so the line names
   only the plugin's missing library;
2. a CPU node without the efa provider: the image's own ``fi_info`` (no EFA device in a
   container).

Before this issue both jobs ran their ranks (NCCL would have fallen back to sockets)."""

import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

pytestmark = [pytest.mark.docker]

SECRET = "preflight-test-secret"
# the marker is split in the command, so that the logged command line does not contain it
COMMAND = ["python3", "-c", "print('RANK' + '-STARTED', flush=True)"]
NVIDIA_SMI = "#!/bin/sh\nfor i in 0 1 2 3 4 5 6 7; do echo \"GPU $i: NVIDIA A100-SXM4-40GB " \
             "(UUID: GPU-$i)\"; done\n"
FI_INFO_OK = "#!/bin/sh\necho 'provider: efa'\necho '    fabric: efa'\n"


def image_path(docker_client, image):
    env = docker_client.images.get(image).attrs["Config"].get("Env") or []
    found = [item.split("=", 1)[1] for item in env if item.startswith("PATH=")]
    return found[0] if found else "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def broken_plugin(tmp_path):
    """A directory holding a ``libnccl-net.so`` that needs ``libmnpmissing.so``, which is gone."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler on this host")
    (tmp_path / "dep.c").write_text("int mnp_missing(void) { return 2; }\n")
    (tmp_path / "use.c").write_text("int mnp_missing(void);\n"
                                    "int mnp_call(void) { return mnp_missing(); }\n")
    plugin_dir = tmp_path / "plugin"
    plugin_dir.mkdir()
    missing = tmp_path / "libmnpmissing.so"
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(missing), str(tmp_path / "dep.c")],
                   check=True)
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(plugin_dir / "libnccl-net.so"),
                    str(tmp_path / "use.c"), "-L", str(tmp_path), "-lmnpmissing"], check=True)
    missing.unlink()
    return plugin_dir


def tools(tmp_path, fi_info_ok):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    programs = {"nvidia-smi": NVIDIA_SMI}
    if fi_info_ok:
        programs["fi_info"] = FI_INFO_OK
    for name, script in programs.items():
        (bindir / name).write_text(script)
        (bindir / name).chmod(0o755)
    return bindir


def run_job(cluster, docker_client, mounts, extra_path):
    """Start main and child; both must exit with the infrastructure code (200) before any rank
    starts. Returns their logs."""
    path = extra_path + ":" + image_path(docker_client, cluster.image)
    # the child, stopped, tries to tell the main node (gone: it stopped too) for this long
    env = dict(MNP_SECRET=SECRET, MNP_FABRIC="efa", MNP_WAIT_TIMEOUT="10", PATH=path)
    # a stand-in EFA device, as the job definition passes the real ones: without any, the node
    # stops at the device check (plan/checks.py) before the preflight this file is about
    devices = Path(tempfile.mkdtemp(prefix="mnp-uverbs-"))
    (devices / "uverbs0").write_text("")
    mounts = {**mounts, devices: "/dev/infiniband"}
    main = cluster.node(0, 2, COMMAND, mounts=mounts, **env)
    child = cluster.node(1, 2, COMMAND, main_ip=cluster.ip(main), mounts=mounts, **env)
    logs = []
    for container in (main, child):
        code = cluster.wait_exit(container, 90)
        text = cluster.logs(container)
        assert code == 200, text
        assert "RANK-STARTED" not in text and "running:" not in text, text
        assert "registered" not in text and "sshd listening" not in text, text
        errors = [line for line in text.splitlines() if "error:" in line]
        assert len(errors) == 1, text
        assert "EFA preflight failed before any rank started" in errors[0]
        logs.append(errors[0])
    return logs


def test_a_plugin_with_a_missing_library_stops_every_node(cluster, docker_client, tmp_path):
    plugin_dir = broken_plugin(tmp_path)
    bindir = tools(tmp_path, fi_info_ok=True)
    mounts = {plugin_dir: "/opt/aws-ofi-nccl/lib", bindir: "/opt/mnp-test/bin"}
    for line in run_job(cluster, docker_client, mounts, "/opt/mnp-test/bin"):
        assert "the aws-ofi-nccl plugin /opt/aws-ofi-nccl/lib/libnccl-net.so cannot be " \
               "loaded: libmnpmissing.so: cannot open shared object file" in line, line
        assert "fi_info" not in line


def test_a_node_without_the_efa_provider_stops_every_node(cluster, docker_client):
    for line in run_job(cluster, docker_client, {}, "/opt/mnp-test/bin"):  # the image's fi_info
        assert "fi_info" in line and "efa" in line, line
        assert "plugin" not in line  # a CPU node: NCCL's plugin is not checked

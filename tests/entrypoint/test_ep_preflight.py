"""Issue 16 item 3: on EFA plans NCCL is pinned to the aws-ofi-nccl plugin (``NCCL_NET``, a row of
the env table), and before any rank starts each node checks that libfabric finds the ``efa``
provider and that the plugin loads with every library it needs. The checks here run real
processes: a stand-in ``fi_info`` and plugin libraries built with the host's C compiler (one
linked against a library that is then deleted)."""

import glob
import json
import os
import shutil
import subprocess

import pytest
from test_ep_plan import gpu_efa, make, node

from entrypoint import schedulers
from entrypoint.plan import envtable
from entrypoint.plan import make as plan
from entrypoint.probe import preflight
from entrypoint.settings import config

# -- the NCCL_NET row ----------------------------------------------------------------------------


@pytest.mark.parametrize("plugin,expected", [
    ("1.7.4", "AWS Libfabric"), ("1.11.0", "AWS Libfabric"),
    # issue 23: the rename (PR #530) first ships in v1.13.0-aws; 1.12.x still says
    # "AWS Libfabric", and NCCL_NET=Libfabric fails its init ("network Libfabric not found")
    ("1.12.0", "AWS Libfabric"), ("1.12.1", "AWS Libfabric"), ("1.13.0", "Libfabric"),
    ("1.15.0", "Libfabric"), (None, "AWS Libfabric"),
])
def test_efa_plans_pin_nccl_to_the_plugin_by_its_name(plugin, expected):
    p = make(gpu_efa(plugin, "1.18.0", "p4d.24xlarge", nccl="2.18.3"))
    assert p.value("NCCL_NET") == expected
    entry = next(e for e in p.env if e["name"] == "NCCL_NET")
    assert entry["source"] == envtable.OFI_NET_NAME and "nvidia_plugin_name_fixup" in \
        entry["source"]
    if plugin is None:
        assert "guessed: aws-ofi-nccl version unknown" in entry["reason"]
    assert p.environment["NCCL_NET"] == expected


def test_no_plugin_pin_over_tcp_or_without_the_plugin():
    tcp = make(gpu_efa("1.13.0", "1.22.0", "p5.48xlarge", nccl="2.23.4"), MNP_FABRIC="tcp")
    assert tcp.value("NCCL_NET") == "Socket"
    bare = make(gpu_efa("1.13.0", "1.22.0", "p5.48xlarge", nccl="2.23.4"))
    assert bare.value("NCCL_NET") == "Libfabric"
    no_plugin = gpu_efa(None, "1.22.0", "p5.48xlarge", nccl="2.23.4")
    no_plugin.plugin_path = None
    p = make(no_plugin)
    assert p.value("NCCL_NET") is None
    assert [c["kind"] for c in p.preflight] == ["provider", "plugin"]
    assert p.preflight[1]["argv"] is None


# -- the preflight as plan lines -----------------------------------------------------------------


def test_the_plan_lists_the_checks_and_a_dry_run_runs_none():
    p = make(gpu_efa("1.13.0", "1.22.0", "p5.48xlarge", nccl="2.23.4"))
    assert [c["argv"] for c in p.preflight] == [
        ["/opt/amazon/efa/bin/fi_info", "-p", "efa", "-t", "FI_EP_RDM"],
        ["/usr/bin/python3", "-c", preflight.LOAD_SNIPPET, "/opt/aws-ofi-nccl/lib/libnccl-net.so"]]
    text = p.text()
    assert "preflight (a real run checks this before any rank starts): fi_info -p efa -t " \
           "FI_EP_RDM lists the efa provider" in text
    assert "the aws-ofi-nccl plugin /opt/aws-ofi-nccl/lib/libnccl-net.so" in text
    assert json.loads(json.dumps(p.to_dict()))["preflight"] == p.preflight


def test_no_preflight_on_tcp_plans_and_no_plugin_check_without_gpus():
    assert make(gpu_efa("1.13.0", "1.22.0", "p5.48xlarge"), MNP_FABRIC="tcp").preflight == []
    cpu = make(node(efa_devices=["uverbs0"], fi_info_efa=True), MNP_FABRIC="efa")
    assert [c["kind"] for c in cpu.preflight] == ["provider"]


# -- the checks, run -----------------------------------------------------------------------------


def fake_fi_info(tmp_path, script):
    path = tmp_path / "fi_info"
    path.write_text("#!/bin/sh\n" + script)
    path.chmod(0o755)
    return str(path)


def provider_check(fi_info):
    return {"kind": "provider", "check": "fi_info -p efa -t FI_EP_RDM lists the efa provider",
            "argv": [fi_info, "-p", "efa", "-t", "FI_EP_RDM"]}


def test_fi_info_without_the_efa_provider_is_named(tmp_path):
    failing = fake_fi_info(tmp_path, "echo 'fi_getinfo: -61 (No data available)' >&2\nexit 1\n")
    assert preflight.run([provider_check(failing)], dict(os.environ)) == [
        "fi_info -p efa -t FI_EP_RDM finds no efa provider (exit 1: fi_getinfo: -61 (No data available))"]
    missing = preflight.run([provider_check(str(tmp_path / "nowhere" / "fi_info"))], {})
    assert missing[0].startswith("fi_info (libfabric) cannot run:")
    good = fake_fi_info(tmp_path, "echo 'provider: efa'\necho '    fabric: efa'\n")
    assert preflight.run([provider_check(good)], dict(os.environ)) == []


def build_plugins(tmp_path):
    """``(good, broken)``: two shared libraries; ``broken`` needs libmnpmissing.so, which is
    built, linked against and deleted (the state of a plugin whose dependency is not there)."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler on this host")
    src = tmp_path / "x.c"
    src.write_text("int mnp_plugin_marker(void) { return 1; }\n")
    dep = tmp_path / "dep.c"
    dep.write_text("int mnp_missing(void) { return 2; }\n")
    use = tmp_path / "use.c"
    use.write_text("int mnp_missing(void);\nint mnp_call(void) { return mnp_missing(); }\n")
    good, missing = tmp_path / "libnccl-net.so", tmp_path / "libmnpmissing.so"
    broken = tmp_path / "broken" / "libnccl-net.so"
    broken.parent.mkdir()
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(good), str(src)], check=True)
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(missing), str(dep)], check=True)
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(broken), str(use), "-L", str(tmp_path),
                    "-lmnpmissing"], check=True)
    missing.unlink()
    return str(good), str(broken)


def plugin_check(path):
    facts = gpu_efa("1.13.0", "1.22.0", "p5.48xlarge")
    facts.plugin_path = path
    facts.binaries["python3"] = shutil.which("python3")
    return preflight.checks("efa", facts)[1]


def test_a_plugin_whose_library_is_missing_is_named(tmp_path):
    good, broken = build_plugins(tmp_path)
    env = dict(os.environ)
    assert preflight.run([plugin_check(good)], env) == []
    failures = preflight.run([plugin_check(broken)], env)
    assert len(failures) == 1
    assert failures[0].startswith(f"the aws-ofi-nccl plugin {broken} cannot be loaded: ")
    assert "libmnpmissing.so: cannot open shared object file" in failures[0]
    assert "\n" not in failures[0]
    assert preflight.run([{"kind": "plugin", "check": "x", "argv": None}], env) == [
        "no aws-ofi-nccl plugin (libnccl-net*.so) is installed: NCCL would fall back to its "
        "sockets"]


# -- the entrypoint as a process: the job stops before any rank starts ---------------------------


def test_an_efa_job_without_the_provider_stops_before_the_launcher(local_node, tmp_path):
    """MNP_FABRIC=efa on a node whose fi_info finds no efa provider: the infrastructure code
    (200: another host may have a working EFA), one error line naming it, and the launcher (a
    stand-in mpirun that records its start) never runs."""
    started = tmp_path / "launcher-started"
    local_node.fake_program("fi_info", "#!/bin/sh\necho 'fi_getinfo: -61 (No data available)' "
                                       ">&2\nexit 1\n")
    bindir = local_node.fake_program("mpirun", f"#!/bin/sh\ntouch {started}\n")
    path = f"{bindir}:{os.environ.get('PATH', '/usr/bin:/bin')}"
    result = local_node.run(["python3", "train.py"], MNP_FABRIC="efa", MNP_SLOTS_PER_NODE="2",
                            MNP_STATE_DIR=str(tmp_path / "state"),
                            PATH=path)
    assert result.returncode == 200, result.stderr
    errors = [line for line in result.stderr.splitlines() if "error:" in line]
    if not glob.glob("/dev/infiniband/uverbs*"):  # issue 31: no device is the first finding
        assert len(errors) == 1 and "no /dev/infiniband/uverbs* device" in errors[0], errors
    else:
        assert "exit 200 (infrastructure on node 0): EFA preflight failed" in \
            result.stderr.splitlines()[-1]
        assert len(errors) == 1 and "EFA preflight failed before any rank started" in errors[0]
        assert "fi_info -p efa -t FI_EP_RDM finds no efa provider" in errors[0], result.stderr
    assert not started.exists() and "Traceback" not in result.stderr
    # the dry run shows the same check and runs nothing
    dry = local_node.run(["python3", "train.py"], MNP_FABRIC="efa", MNP_DRY_RUN="1",
                         PATH=path)
    assert "preflight (a real run checks this before any rank starts): fi_info -p efa" in \
        dry.stdout


# -- issue 16 item 12: the sources of the plan's rows say what upstream says ---------------------


def test_the_libnccl_net_ofi_rename_is_credited_to_the_plugin_release_notes():
    facts = gpu_efa("1.15.0", "1.22.0", "p5.48xlarge", nccl="2.23.4")
    facts.plugin_path, facts.plugin_ofi_only = "/opt/amazon/ofi-nccl/lib/libnccl-net-ofi.so", True
    entry = next(e for e in make(facts).env if e["name"] == "NCCL_NET_PLUGIN")
    assert "aws-ofi-nccl/blob/master/RELEASENOTES.md 'v1.15.0'" in entry["source"]
    assert "EFA installer" not in entry["source"]


def test_the_wrapper_and_credit_sources_are_precise():
    assert "commit c3aff89c" in envtable.HCCL_WRAPPER and "commit 2862240b" in envtable.HCCL_WRAPPER
    reason = envtable.NOT_SET_REASONS["FI_EFA_TX_MIN_CREDITS"][1]
    assert "P3 and P3dn" in reason and "libfabric/pull/7650" in reason
    assert "only the November 2019" not in reason


def test_every_row_and_not_set_reason_cites_a_url():
    """A source is a document a reader can open: a URL (and section), not just a title."""
    uncited = [row.setting for row in envtable.ROWS if "https://" not in row.source]
    uncited += [name for name, (_, why) in envtable.NOT_SET_REASONS.items()
                if "https://" not in why]
    assert uncited == []


def launcher_node():
    """The same image on a node without EFA devices (no vpc.amazonaws.com/efa on the pod)."""
    return node(slots=1, slots_source="test", efa_devices=[], fi_info_efa=None,
                versions={"aws-ofi-nccl": "1.13.0", "nccl": "2.23.4"},
                plugin_path="/opt/aws-ofi-nccl/lib/libnccl-net.so")


def test_a_node_that_runs_no_ranks_plans_efa_but_checks_nothing_on_itself():
    """issue 23: an MPIJob launcher (no EFA device; the operator runs the ranks on the workers)
    and an salloc shell on a login node. Their plan's variables go to the ranks; the device
    preflight belongs to the nodes that run them."""
    slurm_salloc = {k: v for k, v in schedulers.MODULES["slurm"].example(2, 0).items()
                    if not k.startswith("SLURM_STEP") and k != "SLURM_NODEID"}
    for env in ({"K_MPI_JOB_ROLE": "launcher"}, slurm_salloc):
        cfg = config.load(dict(env, MNP_FABRIC="efa"))
        p = plan.make_plan(cfg, launcher_node(), ["python3", "train.py"], {"PATH": "/bin"})
        assert (p.fabric["kind"], p.preflight) == ("efa", []), cfg.scheduler
        assert p.role["node"]["runs_ranks"] is False
        assert any(n.startswith("no rank runs on this node") for n in p.notes)
        cfg = config.load(env)  # auto: this node's devices say nothing of the ranks'
        p = plan.make_plan(cfg, launcher_node(), ["python3", "train.py"], {"PATH": "/bin"})
        assert any(n.startswith("MNP_FABRIC=auto decided the fabric from this node, which runs "
                                "no ranks") for n in p.notes)
    batch_script = schedulers.MODULES["slurm"].example(2, 0)
    for name in ("SLURM_STEP_ID", "SLURM_STEP_NODELIST", "SLURM_STEP_NUM_NODES",
                 "SLURM_STEP_TASKS_PER_NODE"):
        del batch_script[name]
    cfg = config.load(dict(batch_script, MNP_FABRIC="efa"))  # on node 0, whose ranks it starts
    p = plan.make_plan(cfg, launcher_node(), ["python3", "train.py"], {"PATH": "/bin"})
    assert [c["kind"] for c in p.preflight][:1] == ["provider"]

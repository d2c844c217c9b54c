"""The plan as a pure function of (settings, node facts): faults 1-5 of issue 8 and the rules of
the settings table. No machine is probed here; the facts are written out as a node would have
them."""

import json

import pytest

from entrypoint import launchers
from entrypoint.plan import envtable
from entrypoint.plan import make as plan
from entrypoint.probe.facts import NodeFacts
from entrypoint.settings import config

MAIN = {"AWS_BATCH_JOB_NODE_INDEX": "0", "AWS_BATCH_JOB_MAIN_NODE_INDEX": "0",
        "AWS_BATCH_JOB_NUM_NODES": "2", "MNP_SECRET": "s"}
ALL_BINARIES = {"mpirun": "/opt/amazon/openmpi/bin/mpirun", "sshd": "/usr/sbin/sshd",
                "fi_info": "/opt/amazon/efa/bin/fi_info", "python3": "/usr/bin/python3"}


def node(**kw):
    defaults = dict(address="10.0.0.5", interface="eth0", address_reason="test", is_root=True,
                    binaries=dict(ALL_BINARIES), home="/root")
    defaults.update(kw)
    return NodeFacts(**defaults)


def gpu_efa(plugin, libfabric, itype, nccl="2.4.8", gpus=8, **kw):
    versions = {"aws-ofi-nccl": plugin, "libfabric": libfabric, "nccl": nccl,
                "efa-installer": "1.10.0"}
    return node(gpus=gpus, slots=gpus, slots_source="nvidia-smi -L", efa_devices=["uverbs0"],
                fi_info_efa=True, instance_type=itype, instance_source="MNP_INSTANCE_TYPE",
                versions=versions, plugin_path="/opt/aws-ofi-nccl/lib/libnccl-net.so",
                libdirs=["/opt/amazon/efa/lib", "/opt/amazon/openmpi/lib"], **kw)


def make(facts, command=("python3", "train.py"), user_env=None, **settings):
    env = dict(MAIN)
    env.update(settings)
    return plan.make_plan(config.load(env), facts, list(command), user_env or {"PATH": "/bin"})


# -- fault 1: NCCL_SOCKET_IFNAME form by NCCL version ------------------------------------------

def test_fault1_nccl_248_gets_the_plain_interface_name():
    p = make(gpu_efa("1.6.0", "1.11.1", "p3dn.24xlarge", nccl="2.4.8"))
    assert p.value("NCCL_SOCKET_IFNAME") == "eth0"
    assert "-x NCCL_SOCKET_IFNAME" in " ".join(p.argv)


def test_fault1_exact_match_only_from_nccl_256():
    assert make(gpu_efa("1.7.4", "1.18.0", "p4d.24xlarge", nccl="2.5.6")).value(
        "NCCL_SOCKET_IFNAME") == "=eth0"
    assert make(gpu_efa("1.7.4", "1.18.0", "p4d.24xlarge", nccl="2.5.5")).value(
        "NCCL_SOCKET_IFNAME") == "eth0"
    # GPUs but no NCCL version known: the plain name works with every release
    unknown = make(node(gpus=8, slots=8, slots_source="nvidia-smi -L"))
    assert unknown.value("NCCL_SOCKET_IFNAME") == "eth0"
    assert "guessed: nccl version unknown" in json.dumps(unknown.env)


def test_no_nccl_settings_on_a_node_without_nccl_or_gpus():
    """A CPU (or Gaudi) node with no NCCL gets no NCCL_SOCKET_IFNAME guess."""
    cpu = make(node())
    assert cpu.value("NCCL_SOCKET_IFNAME") is None
    assert "nccl version unknown" not in json.dumps(cpu.env)
    assert make(dl1()).value("NCCL_SOCKET_IFNAME") is None
    assert make(node(versions={"nccl": "2.18.3"})).value("NCCL_SOCKET_IFNAME") == "=eth0"


def test_pdsh_ssh_args_only_where_pdsh_is_installed():
    assert make(node()).value("PDSH_SSH_ARGS_APPEND") is None
    facts = node()
    facts.binaries["pdsh"] = "/usr/bin/pdsh"
    assert make(facts).value("PDSH_SSH_ARGS_APPEND") == "-F /run/mnp/ssh/ssh_config"


# -- fault 2: torchrun on PyTorch without torch.distributed.run ---------------------------------

def test_fault2_torchrun_on_pytorch_14_uses_distributed_launch():
    facts = gpu_efa("1.6.0", "1.11.1", "p3dn.24xlarge")
    facts.versions["pytorch"] = "1.4.0"
    p = make(facts, MNP_LAUNCHER="torchrun", MNP_SLOTS_PER_NODE="8")
    assert p.argv[:3] == ["python3", "-m", "torch.distributed.launch"]
    assert "torch.distributed.run" not in p.argv
    assert p.argv[p.argv.index("--nproc_per_node") + 1] == "8"
    assert p.argv[p.argv.index("--node_rank") + 1] == "0"
    assert p.argv[-1] == "train.py"
    assert p.launcher["unit"] == "torch.distributed.launch" and not p.launcher["needs_ssh"]
    assert any("no torch.distributed.run" in n for n in p.notes)
    assert p.problems == []


def test_torchrun_on_new_pytorch_stays_torchrun():
    facts = node(versions={"pytorch": "2.0.1"})
    facts.binaries["torchrun"] = "/usr/local/bin/torchrun"
    assert make(facts, MNP_LAUNCHER="torchrun").argv[0] == "torchrun"
    facts.binaries["torchrun"] = None
    assert make(facts, MNP_LAUNCHER="torchrun").argv[:3] == ["python3", "-m",
                                                              "torch.distributed.run"]


def test_distributed_launch_refuses_a_non_python_program():
    p = make(node(versions={"pytorch": "1.4.0"}), command=["./run.sh"],
             MNP_LAUNCHER="torch.distributed.launch")
    assert any("Python scripts only" in x for x in p.problems)


@pytest.mark.parametrize("launcher", ["torchrun", "torch.distributed.launch"])
def test_a_pytorch_launcher_without_pytorch_is_a_problem(launcher):
    p = make(node(), MNP_LAUNCHER=launcher)  # no torch package, no torchrun program
    assert p.problems == [f"{launcher} needs PyTorch, but neither the torch package nor a "
                          "torchrun program was found: install PyTorch or set MNP_LAUNCHER"]
    facts = node()
    facts.binaries["torchrun"] = "/usr/local/bin/torchrun"  # a torchrun program is enough
    assert make(facts, MNP_LAUNCHER=launcher).problems == []


# -- fault 3: Gaudi over EFA, DeepSpeed 0.6 with pdsh -------------------------------------------

def dl1(**kw):
    fields = dict(hpus=8, slots=8, slots_source="/dev/hl[0-9]* (8 HPUs)",
                  efa_devices=["uverbs0"], fi_info_efa=True, instance_type="dl1.24xlarge",
                  versions={"synapseai": "1.6.0", "pytorch": "1.12.0", "deepspeed": "0.6.1",
                            "efa-installer": "1.16.0"},
                  hccl_wrapper="/usr/lib/habanalabs/libhccl_ofi_wrapper.so",
                  libdirs=["/opt/amazon/efa/lib", "/opt/amazon/openmpi/lib"])
    fields.update(kw)
    return node(**fields)


def test_fault3_dl1_hccl_over_ofi_and_deepspeed_env_file():
    facts = dl1()
    facts.binaries.update(deepspeed="/usr/local/bin/deepspeed", pdsh="/usr/bin/pdsh")
    p = make(facts, MNP_LAUNCHER="deepspeed")
    assert p.value("HCCL_OVER_OFI") == "1"
    assert p.value("HCCL_OVER_TCP") == "0"
    assert p.value("HCCL_SOCKET_IFNAME") == "eth0"
    assert p.environment["LD_LIBRARY_PATH"].split(":") == [
        "/usr/lib/habanalabs", "/opt/amazon/efa/lib", "/opt/amazon/openmpi/lib"]
    assert "FI_PROVIDER" not in p.environment  # no Habana source asks for it
    assert p.launcher["runner"] == "pdsh"
    assert "--launcher_args" not in p.argv  # DeepSpeed 0.6 pdsh needs none
    assert "DS_ENV_FILE" not in p.environment  # DeepSpeed 0.6.1 does not read it
    (envfile,) = p.files
    assert envfile["path"] == "/root/.deepspeed_env"
    lines = envfile["content"].splitlines()
    for needed in ("HCCL_OVER_OFI=1", "HCCL_OVER_TCP=0", "HCCL_SOCKET_IFNAME=eth0"):
        assert needed in lines
    assert any(line.startswith("LD_LIBRARY_PATH=/usr/lib/habanalabs") for line in lines)
    assert p.problems == []


def test_fault3_new_deepspeed_uses_ds_env_file_and_no_pdsh_means_openmpi():
    facts = node(versions={"deepspeed": "0.14.4"})
    facts.binaries["deepspeed"] = "/usr/local/bin/deepspeed"
    p = make(facts, MNP_LAUNCHER="deepspeed", MNP_STATE_DIR="/run/mnp")
    assert p.environment["DS_ENV_FILE"] == "/run/mnp/deepspeed_env"
    assert p.files[0]["path"] == "/run/mnp/deepspeed_env"
    assert p.launcher["runner"] == "openmpi" and "pdsh is not installed" in p.launcher[
        "runner_why"]
    assert "--launcher_args=--allow-run-as-root" in p.argv


def test_dl1_without_the_wrapper_says_hccl_cannot_use_efa():
    p = make(dl1(hccl_wrapper=None), MNP_LAUNCHER="none")
    assert "HCCL_OVER_OFI" not in p.environment
    assert any("hccl_ofi_wrapper" in n for n in p.notes)


# -- fault 4: EFA settings by plugin version, socket tuning with MNP_SLOTS_PER_NODE -------------

def test_fault4_plugin_16_needs_neither_fi_provider_nor_proto_simple():
    p = make(gpu_efa("1.6.0", "1.11.1", "p3dn.24xlarge"))
    assert "FI_PROVIDER" not in p.environment
    assert "NCCL_PROTO" not in p.environment
    assert "FI_EFA_USE_DEVICE_RDMA" not in p.environment  # p3dn: no RDMA read
    assert {e["name"] for e in p.not_set} >= {"FI_PROVIDER", "NCCL_PROTO"}


def test_fault4_plugin_15_and_older_need_both():
    p = make(gpu_efa("1.5.0", "1.11.1", "p3dn.24xlarge"))
    assert p.value("FI_PROVIDER") == "efa" and p.value("NCCL_PROTO") == "simple"
    assert all("aws-ofi-nccl" in e["source"] for e in p.env if e["name"] == "NCCL_PROTO")


@pytest.mark.parametrize("plugin,libfabric,expected", [
    ("1.6.0", "1.18.0", "1"), ("1.7.4", "1.11.1", "1"), ("1.7.4", "1.18.0", None),
    ("1.12.1", "1.22.0", None),
])
def test_fault4_device_rdma_only_where_the_software_does_not_enable_it(plugin, libfabric,
                                                                       expected):
    p = make(gpu_efa(plugin, libfabric, "p4d.24xlarge", nccl="2.16.2"))
    assert p.environment.get("FI_EFA_USE_DEVICE_RDMA") == expected


def tcp_gpu(vendor):
    return node(gpus=8, slots=8, slots_source="nvidia-smi -L", nic_vendor=vendor,
                versions={"nccl": "2.4.8"})


def test_fault4_socket_tuning_runs_with_mnp_slots_per_node_set():
    # Every generated job definition sets MNP_SLOTS_PER_NODE; the tuning must still apply.
    p = make(tcp_gpu(None), MNP_SLOTS_PER_NODE="8", MNP_FABRIC="tcp")
    assert p.value("NCCL_SOCKET_NTHREADS") == "2"
    assert p.value("NCCL_NSOCKS_PERTHREAD") == "8"
    assert "-x NCCL_NSOCKS_PERTHREAD" in " ".join(p.argv)


def test_fault4_no_socket_tuning_on_ena_where_nccl_tunes_itself():
    p = make(tcp_gpu("0x1d0f"), MNP_SLOTS_PER_NODE="8", MNP_FABRIC="tcp")
    assert "NCCL_SOCKET_NTHREADS" not in p.environment
    reasons = {e["name"]: e["reason"] for e in p.not_set}
    assert "2 threads x 8 sockets" in reasons["NCCL_SOCKET_NTHREADS"]


# -- fault 5: a missing launcher is a line in the plan, not an exit -----------------------------

def test_fault5_missing_mpirun_is_a_problem_line():
    facts = node()
    facts.binaries["mpirun"] = None
    p = make(facts)
    assert p.argv[0] == "mpirun"
    assert p.problems == ["mpirun not found on PATH: install Open MPI or set MNP_LAUNCHER"]
    assert "PROBLEM (a real run stops here): mpirun not found" in p.text()


def test_plan_json_round_trips_and_has_the_documented_keys():
    data = json.loads(json.dumps(make(gpu_efa("1.6.0", "1.11.1", "p3dn.24xlarge")).to_dict()))
    assert set(data) == {"version", "role", "address", "slots", "fabric", "facts", "launcher",
                         "argv", "children", "hostfile", "env", "not_set", "kept", "mca",
                         "files", "rendezvous", "ssh", "problems", "notes", "preflight",
                         "health", "environment"}
    assert data["role"]["mode"] == "main" and data["fabric"]["kind"] == "efa"
    assert data["hostfile"] == ["10.0.0.5 slots=8", "<node-1> slots=8"]


def test_secrets_never_reach_the_plan():
    p = make(node(), user_env={"MNP_SECRET": "x", "HF_TOKEN": "t", "PATH": "/bin"})
    assert "MNP_SECRET" not in p.environment
    assert p.to_dict()["environment"]["HF_TOKEN"] == "<redacted>"


def test_exported_secrets_are_written_but_never_printed():
    facts = node(versions={"deepspeed": "0.14.4"})
    facts.binaries["deepspeed"] = "/usr/local/bin/deepspeed"
    p = make(facts, user_env={"WANDB_API_KEY": "k3y", "PATH": "/bin"}, MNP_LAUNCHER="deepspeed",
             MNP_EXPORT_ENV="WANDB_API_KEY")
    assert "WANDB_API_KEY=k3y" in p.files[0]["content"].splitlines()  # what the run writes
    assert "k3y" not in p.text() and "k3y" not in json.dumps(p.to_dict())


def test_user_values_win_and_are_listed():
    p = make(node(versions={"nccl": "2.16.2"}), user_env={"NCCL_SOCKET_IFNAME": "ens5"})
    assert p.environment["NCCL_SOCKET_IFNAME"] == "ens5"
    assert p.kept == ["NCCL_SOCKET_IFNAME=ens5 (ours: =eth0)"]


def test_child_with_ssh_launcher_runs_nothing_and_child_torchrun_runs_its_rank():
    env = dict(MAIN, AWS_BATCH_JOB_NODE_INDEX="1",
               AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS="10.0.0.1")
    child = plan.make_plan(config.load(env), node(), ["python3", "train.py"], {})
    assert child.argv is None and "over SSH" in child.children
    env["MNP_LAUNCHER"] = "torchrun"
    torch = plan.make_plan(config.load(env), node(versions={"pytorch": "2.3.1"}),
                           ["python3", "train.py"], {})
    assert torch.argv[torch.argv.index("--node_rank") + 1] == "1"
    assert torch.argv[torch.argv.index("--master_addr") + 1] == "10.0.0.1"


# -- the table itself -------------------------------------------------------------------------

def test_every_row_has_a_source_and_valid_ranges():
    for row in envtable.ROWS:
        assert row.source.startswith(("http", "AWS", "https")), row.setting
        for key, spec in row.when.items():
            if key not in envtable.CONTEXT_KEYS:
                assert envtable.in_range("1.0.0", spec) in (True, False), (row.setting, spec)


@pytest.mark.parametrize("version,spec,expected", [
    ("1.18.0amzn1.0", ">=1.18.0", True), ("1.7.4-aws", "<1.7.0", False),
    ("2.4.8", "<2.5.6", True), ("2.5.6", "<2.5.6", False), ("1.6", ">=1.6.0,<1.7.0", True),
    (None, ">=1.0", None), ("?", ">=1.0", None),
])
def test_in_range(version, spec, expected):
    assert envtable.in_range(version, spec) is expected


def test_launcher_names_are_the_units():
    assert set(launchers.NAMES) == set(launchers.UNITS)
    assert launchers.names() == launchers.NAMES

"""The plan's environment (``plan/env.py``, ``plan/envtable.py``): decisions mutation testing
found unchecked (bench/mutation.py), seen through ``make_plan``: whose value wins, what root,
SSH and hostfiles add, library paths, and the reasons a setting is or is not set."""

from entrypoint.plan import make as plan
from entrypoint.plan.env import Env
from entrypoint.probe.facts import NodeFacts
from entrypoint.settings import config

MAIN = {"AWS_BATCH_JOB_NODE_INDEX": "0", "AWS_BATCH_JOB_MAIN_NODE_INDEX": "0",
        "AWS_BATCH_JOB_NUM_NODES": "2", "MNP_SECRET": "s"}
BINARIES = {"mpirun": "/usr/bin/mpirun", "sshd": "/usr/sbin/sshd", "python3": "/usr/bin/python3"}
HOSTFILES = {"openmpi": "/run/mnp/hostfile", "plain": "/run/mnp/hostfile.plain",
             "intel": "/run/mnp/hostfile.intel"}


def facts(**kw):
    values = dict(address="10.0.0.5", interface="eth0", address_reason="test", is_root=True,
                  binaries=dict(BINARIES), home="/root", slots=1, slots_source="test")
    values.update(kw)
    return NodeFacts(**values)


def efa_gpu(**kw):
    values = dict(gpus=8, slots=8, efa_devices=["uverbs0"], fi_info_efa=True,
                  instance_type="p4d.24xlarge", instance_source="MNP_INSTANCE_TYPE",
                  versions={"aws-ofi-nccl": "1.7.4", "libfabric": "1.18.0", "nccl": "2.14.3"},
                  plugin_path="/opt/aws-ofi-nccl/lib/libnccl-net.so",
                  libdirs=["/opt/amazon/efa/lib", "/opt/amazon/openmpi/lib"])
    values.update(kw)
    return facts(**values)


def make(node, user_env=None, table=None, hostfiles=None, **settings):
    cfg = config.load(dict(MAIN, **settings))
    return plan.make_plan(cfg, node, ["python3", "train.py"], user_env or {"PATH": "/bin"},
                          table=table, hostfiles=hostfiles)


def test_env_set_replaces_a_value_in_place():
    env = Env()
    env.set("A", "1", "first")
    env.set("B", "2", "second")
    env.set("A", "3", "again", "src")
    assert env.entries == [{"name": "A", "value": "3", "reason": "again", "source": "src"},
                           {"name": "B", "value": "2", "reason": "second", "source": ""}]
    assert env.as_dict() == {"A": "3", "B": "2"}


def test_the_users_values_win_and_are_listed_only_when_different():
    user = {"PATH": "/bin", "OMPI_ALLOW_RUN_AS_ROOT": "0", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
            "MNP_NUM_NODES": "99"}
    p = make(facts(), user)
    assert p.environment["OMPI_ALLOW_RUN_AS_ROOT"] == "0"
    assert p.kept == ["OMPI_ALLOW_RUN_AS_ROOT=0 (ours: 1)"]  # the equal one is not listed
    assert p.environment["MNP_NUM_NODES"] == "2"  # MNP_* are always ours
    assert p.value("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM") == "1"


def test_library_path_keeps_the_users_first_and_adds_ours_once():
    user = {"PATH": "/bin", "LD_LIBRARY_PATH": "/mine:/opt/amazon/efa/lib::"}
    p = make(efa_gpu(), user)
    assert p.environment["LD_LIBRARY_PATH"] == (
        "/mine:/opt/amazon/efa/lib:/opt/amazon/openmpi/lib:/opt/aws-ofi-nccl/lib")
    assert not any(k.startswith("LD_LIBRARY_PATH") for k in p.kept)
    assert p.environment["MNP_NUM_NODES"] == "2"  # what comes after it is merged too


def test_root_and_ssh_settings():
    p = make(facts(binaries=dict(BINARIES, pdsh="/usr/bin/pdsh")))
    config_path = "/run/mnp/ssh/ssh_config"
    assert (p.value("OMPI_ALLOW_RUN_AS_ROOT"), p.value("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM")) == (
        "1", "1")
    assert p.value("OMPI_MCA_plm_rsh_args") == "-F " + config_path
    assert p.value("PDSH_SSH_ARGS_APPEND") == "-F " + config_path
    assert p.value("MNP_SSH_CONFIG") == config_path
    plain = make(facts(is_root=False))
    assert plain.value("OMPI_ALLOW_RUN_AS_ROOT") is None
    assert plain.value("PDSH_SSH_ARGS_APPEND") is None  # no pdsh here
    torchrun = make(facts(), MNP_LAUNCHER="torchrun")  # no SSH between the nodes
    assert torchrun.value("MNP_SSH_CONFIG") is None and torchrun.value(
        "OMPI_MCA_plm_rsh_args") is None


def test_the_jobs_wiring_variables():
    from entrypoint.core.nodes import NodeInfo

    table = [NodeInfo(1, "10.0.0.7", 4, ""), NodeInfo(0, "10.0.0.5", 2, "")]
    p = make(facts(), table=table, hostfiles=HOSTFILES)
    assert {name: p.value(name) for name in (
        "MNP_HOSTFILE", "MNP_HOSTFILE_PLAIN", "MNP_HOSTFILE_INTEL", "MNP_NUM_NODES",
        "MNP_NODE_INDEX", "MNP_NODE_ADDRESS", "MNP_MASTER_ADDRESS", "MNP_NP")} == {
        "MNP_HOSTFILE": "/run/mnp/hostfile", "MNP_HOSTFILE_PLAIN": "/run/mnp/hostfile.plain",
        "MNP_HOSTFILE_INTEL": "/run/mnp/hostfile.intel", "MNP_NUM_NODES": "2",
        "MNP_NODE_INDEX": "0", "MNP_NODE_ADDRESS": "10.0.0.5", "MNP_MASTER_ADDRESS": "10.0.0.5",
        "MNP_NP": "6"}
    assert make(facts(), table=table, hostfiles=HOSTFILES, MNP_NP="3").value("MNP_NP") == "3"
    single = plan.make_plan(config.load({}), facts(), ["python3", "t.py"], {"PATH": "/bin"})
    assert single.value("MNP_MASTER_ADDRESS") == "127.0.0.1"


def test_efa_library_path_names_its_parts():
    p = make(efa_gpu())
    entry = next(e for e in p.env if e["name"] == "LD_LIBRARY_PATH")
    assert entry["value"] == "/opt/amazon/efa/lib:/opt/amazon/openmpi/lib:/opt/aws-ofi-nccl/lib"
    assert entry["reason"] == "EFA's libfabric and Open MPI and the aws-ofi-nccl plugin " \
                              "(appended to yours)"
    assert p.value("NCCL_NET_PLUGIN") is None
    assert entry["source"] == "" and not any("libhccl" in note for note in p.notes)
    ofi_only = make(efa_gpu(plugin_path="/opt/amazon/ofi-nccl/lib/libnccl-net-ofi.so",
                            plugin_ofi_only=True))
    assert ofi_only.value("NCCL_NET_PLUGIN") == "ofi"
    no_plugin = make(efa_gpu(plugin_path=None))
    entry = next(e for e in no_plugin.env if e["name"] == "LD_LIBRARY_PATH")
    assert entry["reason"] == "EFA's libfabric and Open MPI (appended to yours)"
    assert "no aws-ofi-nccl plugin found: NCCL cannot use EFA" in no_plugin.notes
    assert make(facts()).value("LD_LIBRARY_PATH") is None  # TCP: nothing to add


def test_gaudi_over_efa_puts_the_wrapper_first():
    gaudi = dict(hpus=8, slots=8, efa_devices=["uverbs0"], fi_info_efa=True,
                 instance_type="dl1.24xlarge", instance_source="MNP_INSTANCE_TYPE",
                 libdirs=["/opt/amazon/efa/lib"])
    p = make(facts(hccl_wrapper="/usr/lib/habanalabs/libhccl_ofi_wrapper.so", **gaudi))
    entry = next(e for e in p.env if e["name"] == "LD_LIBRARY_PATH")
    assert entry["value"] == "/usr/lib/habanalabs:/opt/amazon/efa/lib"
    assert entry["reason"].startswith("Habana's hccl_ofi_wrapper and EFA's libfabric")
    assert entry["source"].startswith("https://github.com/HabanaAI/hccl_ofi_wrapper")
    missing = make(facts(**gaudi))
    assert any(note.startswith("no libhccl_ofi_wrapper.so found") for note in missing.notes)
    assert not any("aws-ofi-nccl" in note for note in missing.notes)  # not a GPU node


def test_not_set_reasons_are_for_the_nodes_accelerator():
    gpu = {entry["name"] for entry in make(efa_gpu()).not_set}
    assert {"FI_PROVIDER", "NCCL_PROTO"} <= gpu and "HCCL_OVER_OFI" not in gpu
    cpu = make(facts()).not_set
    assert cpu == []


def test_a_guessed_version_is_said_in_the_reason():
    p = make(efa_gpu(versions={"aws-ofi-nccl": "1.7.4", "libfabric": "1.18.0"}, gpus=8))
    reasons = [e["reason"] for e in p.env if "(guessed: " in e["reason"]]
    assert reasons and all("nccl version unknown" in r for r in reasons), p.env


def entry(p, name):
    return next((e for e in p.env if e["name"] == name), None)


def test_device_rdma_applies_when_a_version_it_depends_on_is_unknown():
    plugin_unknown = make(efa_gpu(versions={"libfabric": "1.18.0", "nccl": "2.14.3"}))
    assert entry(plugin_unknown, "FI_EFA_USE_DEVICE_RDMA")["value"] == "1"
    assert "(guessed: aws-ofi-nccl version unknown)" in entry(
        plugin_unknown, "FI_EFA_USE_DEVICE_RDMA")["reason"]
    libfabric_unknown = make(efa_gpu(versions={"aws-ofi-nccl": "1.7.4", "nccl": "2.14.3"}))
    assert entry(libfabric_unknown, "FI_EFA_USE_DEVICE_RDMA")["value"] == "1"
    assert "(guessed: libfabric version unknown)" in entry(
        libfabric_unknown, "FI_EFA_USE_DEVICE_RDMA")["reason"]
    known = make(efa_gpu())  # 1.7.4 with 1.18.0: the plugin enables it by itself
    assert entry(known, "FI_EFA_USE_DEVICE_RDMA") is None


def tcp_gpu(**kw):
    return facts(gpus=8, slots=8, **kw)


def test_socket_tuning_applies_when_the_nccl_version_is_unknown():
    p = make(tcp_gpu())
    assert (p.value("NCCL_SOCKET_NTHREADS"), p.value("NCCL_NSOCKS_PERTHREAD")) == ("2", "8")
    assert "(guessed: nccl version unknown)" in entry(p, "NCCL_SOCKET_NTHREADS")["reason"]


def test_without_an_interface_only_the_interface_settings_are_skipped():
    p = make(tcp_gpu(interface=None, versions={"nccl": "2.14.3"}))
    assert p.value("NCCL_SOCKET_IFNAME") is None and p.value("GLOO_SOCKET_IFNAME") is None
    assert p.value("NCCL_SOCKET_NTHREADS") == "2"  # a later row, no {interface} in it


def test_the_unset_credits_setting_names_the_article_it_came_from():
    reason = next(e["reason"] for e in make(efa_gpu()).not_set
                  if e["name"] == "FI_EFA_TX_MIN_CREDITS")
    assert "(https://aws.amazon.com/blogs/compute/optimizing-deep-learning-on-p3-and-p3dn-with-" \
           "efa/, its mpirun line with NCCL 2.4.8)" in reason

"""Launcher units: the decisions mutation testing found unchecked (bench/mutation.py), seen
through the plan a node makes (``make_plan``) and each unit's command line."""

import pytest

from entrypoint import launchers
from entrypoint.launchers import base, mca, mpirun
from entrypoint.plan import make as plan
from entrypoint.probe.facts import NodeFacts
from entrypoint.settings import config

BATCH_MAIN = {"AWS_BATCH_JOB_NODE_INDEX": "0", "AWS_BATCH_JOB_MAIN_NODE_INDEX": "0",
              "AWS_BATCH_JOB_NUM_NODES": "2", "MNP_SECRET": "s"}
# the srun task on node1 (node 0) of `srun -N2 --ntasks-per-node=1`: a main node Slurm wired
SRUN_MAIN = {"SLURM_JOB_ID": "31", "SLURM_JOB_NODELIST": "node[1-2]", "SLURM_JOB_NUM_NODES": "2",
             "SLURM_LOCALID": "0", "SLURM_NNODES": "2", "SLURM_NODEID": "0",
             "SLURM_NODELIST": "node[1-2]", "SLURM_NTASKS": "2", "SLURM_PROCID": "0",
             "SLURM_STEP_ID": "0", "SLURM_STEP_NODELIST": "node[1-2]",
             "SLURM_STEP_NUM_NODES": "2", "SLURM_STEP_NUM_TASKS": "2",
             "SLURM_STEP_TASKS_PER_NODE": "1(x2)", "SLURM_TASKS_PER_NODE": "1(x2)",
             "SLURMD_NODENAME": "node1"}
# the batch script of `sbatch -N2`: the launcher role, which starts ranks on every node
SBATCH_SCRIPT = {"SLURM_JOB_ID": "32", "SLURM_JOB_NODELIST": "node[1-2]",
                 "SLURM_JOB_NUM_NODES": "2", "SLURM_NNODES": "2", "SLURM_NODEID": "0",
                 "SLURM_NODELIST": "node[1-2]", "SLURM_NTASKS": "2", "SLURM_PROCID": "0",
                 "SLURM_TASKS_PER_NODE": "1(x2)", "SLURMD_NODENAME": "node1", "SLURM_LOCALID": "0"}
BINARIES = {"mpirun": "/usr/bin/mpirun", "sshd": "/usr/sbin/sshd", "python3": "/usr/bin/python3"}


def facts(**kw):
    values = dict(address="10.0.0.5", interface="eth0", address_reason="test", is_root=True,
                  binaries=dict(BINARIES), home="/root", slots=1, slots_source="test")
    values.update(kw)
    return NodeFacts(**values)


def make(env, **settings):
    return plan.make_plan(config.load(dict(env, **settings)), facts(), ["python3", "train.py"],
                          {"PATH": "/bin"})


def test_none_on_batch_main_needs_ssh_and_mpi_settings_for_the_script():
    p = make(BATCH_MAIN, MNP_LAUNCHER="none")
    assert p.launcher["unit"] == "none" and p.launcher["needs_ssh"] is True
    assert p.problems == [] and p.argv == ["python3", "train.py"]
    assert p.value("OMPI_MCA_btl_tcp_if_include") is not None  # a script may call mpirun


def test_none_runs_where_slurm_started_each_node():
    p = make(SRUN_MAIN, MNP_LAUNCHER="none")
    assert p.problems == [] and p.argv == ["python3", "train.py"]
    assert p.value("OMPI_MCA_btl_tcp_if_include") is None  # no wired nodes, no MPI settings


def test_none_and_mpirun_may_start_ranks_from_a_batch_script():
    for unit in ("none", "mpirun"):
        p = make(SBATCH_SCRIPT, MNP_LAUNCHER=unit)
        assert p.role["mode"] == "launcher" and p.problems == [], (unit, p.problems)


def test_a_launcher_that_cannot_reach_hosts_is_a_problem_in_a_batch_script():
    p = make(SBATCH_SCRIPT, MNP_LAUNCHER="torchrun")
    assert any("cannot start ranks on the other nodes" in line for line in p.problems), p.problems


def test_mpirun_sets_open_mpis_variables():
    p = make(BATCH_MAIN, MNP_LAUNCHER="mpirun")
    assert p.value("OMPI_MCA_btl_tcp_if_include") == "eth0"


def test_mpirun_line_is_not_root_unless_told():
    line = mpirun.command_line("mpirun", ["python3", "t.py"], 2, "/h", [])
    assert "--allow-run-as-root" not in line
    assert line[:3] == ["mpirun", "-np", "2"]


@pytest.mark.parametrize("command,found", [
    ([], None),
    (["torchrun", "--nproc_per_node", "8", "train.py"], "torchrun"),
    (["/usr/bin/mpirun", "-np", "2", "a.out"], "mpirun"),
    (["mpiexec", "a.out"], "mpiexec"),
    (["deepspeed", "train.py"], "deepspeed"),
    (["srun", "python3", "t.py"], "srun"),
    (["horovodrun", "-np", "4", "python3", "t.py"], "horovodrun"),
    (["python3", "-m", "torch.distributed.run", "t.py"], "python3 -m torch.distributed.run"),
    (["/usr/bin/python3.11", "-m", "torch.distributed.launch"],
     "python3.11 -m torch.distributed.launch"),
    (["python", "-m", "deepspeed.launcher.runner", "t.py"], "python -m deepspeed.launcher.runner"),
    (["python3", "-m"], None),
    (["python3", "-m", "mymodule", "torch.distributed.run"], None),
    (["python3", "train.py", "-m", "torch.distributed.run"], None),
    (["bash", "-m", "torch.distributed.run"], None),
    (["train.py", "torchrun"], None),
])
def test_the_launcher_a_command_calls_itself(command, found):
    assert launchers.launcher_command(command) == found


def test_export_patterns_name_node_specific_variables_on_purpose():
    env = {"OMPI_MCA_x": "1", "SLURM_JOB_ID": "3", "PATH": "/bin", "HOSTNAME": "h",
           "AB": "1", "BASH_FUNC_f%%": "() {}", "MNP_SECRET": "s"}
    assert base.export_names(env) == ["AB", "PATH"]
    assert base.export_names(env, ["OMPI_*"]) == ["AB", "OMPI_MCA_x", "PATH"]
    assert base.export_names(env, ["HOSTNAME", "NOT_SET"]) == ["AB", "HOSTNAME", "PATH"]
    assert base.export_names(env, ["A*"]) == ["AB", "PATH"]  # a prefix, not a name: AB only
    assert base.export_names(env, ["B*", "MNP_*"]) == ["AB", "PATH"]  # no function, no secret
    slurm_env = {"SLURM_JOB_ID": "3", "SSH_CLIENT": "x", "PATH": "/bin"}
    assert base.export_names(slurm_env, ["SLURM_*"]) == ["PATH", "SLURM_JOB_ID"]


@pytest.mark.parametrize("command,expected", [
    (["train.py", "--lr", "1"], ["python3", "train.py", "--lr", "1"]),
    (["python3", "train.py"], ["python3", "train.py"]),
    (["/usr/bin/python3.11", "t.py"], ["/usr/bin/python3.11", "t.py"]),
    (["a.out", "x.py"], ["a.out", "x.py"]),
    (["t.py", "python3"], ["python3", "t.py", "python3"]),  # only the first word decides
    ([], []),
])
def test_python_program_adds_python3_to_a_bare_script(command, expected):
    assert base.python_program(command) == expected


@pytest.mark.parametrize("command,expected", [
    (["python3"], ("exec", ["python3"])),
    (["python3", "-m"], ("exec", ["python3", "-m"])),
    (["python3", "-m", "pkg.mod", "a"], ("module", ["pkg.mod", "a"])),
    (["python3", "-u", "t.py"], ("exec", ["python3", "-u", "t.py"])),
    (["python3", "t.py", "a"], ("script", ["t.py", "a"])),
    (["t.py", "a"], ("script", ["t.py", "a"])),
    (["./run.sh"], ("exec", ["./run.sh"])),
])
def test_split_program(command, expected):
    assert base.split_program(command) == expected


def test_unit_defaults_start_nothing_alone():
    unit = base.Unit()
    assert (unit.starts_without_ssh, unit.reaches_hosts, unit.joins_elastic,
            unit.needs_ssh) == (False, False, False, False)
    assert unit.uses_mpi(None, {}, False) is False and unit.mpi_findings([]) == ([], [])


def test_only_torchrun_joins_an_elastic_rendezvous():
    elastic = {"PET_RDZV_ENDPOINT": "etcd:2379", "PET_NNODES": "1:3"}
    for unit in ("mpirun", "deepspeed", "none"):
        p = make(elastic, MNP_LAUNCHER=unit)
        assert any("only MNP_LAUNCHER=torchrun joins it" in line for line in p.problems), unit
    torchrun = make(elastic, MNP_LAUNCHER="torchrun").problems
    assert not any("joins it" in line for line in torchrun), torchrun


# -- DeepSpeed --------------------------------------------------------------------------------
def ds_plan(env=BATCH_MAIN, binaries=None, version="0.14.4", user_env=None, **settings):
    node = facts(binaries=dict(BINARIES, deepspeed="/usr/local/bin/deepspeed",
                               **(binaries or {})),
                 versions={"deepspeed": version} if version else {})
    return plan.make_plan(config.load(dict(env, MNP_LAUNCHER="deepspeed", **settings)), node,
                          ["python3", "train.py"], user_env or {"PATH": "/bin"})


def test_deepspeed_runner_follows_pdsh_and_sets_mpi_only_for_openmpi():
    openmpi = ds_plan()
    assert (openmpi.launcher["runner"], openmpi.launcher["needs_ssh"]) == ("openmpi", True)
    assert openmpi.value("OMPI_MCA_btl_tcp_if_include") == "eth0"
    assert "--launcher_args=--allow-run-as-root" in openmpi.argv and openmpi.problems == []
    pdsh = ds_plan(binaries={"pdsh": "/usr/bin/pdsh"})
    assert pdsh.launcher["runner"] == "pdsh" and pdsh.value("OMPI_MCA_btl_tcp_if_include") is None
    assert not any(a.startswith("--launcher_args") for a in pdsh.argv)
    assert ds_plan(env=SBATCH_SCRIPT).problems == []  # reaches the script's hosts itself


def test_deepspeed_says_which_program_is_missing():
    no_pdsh = ds_plan(MNP_DEEPSPEED_LAUNCHER="pdsh")
    assert no_pdsh.problems == [
        "pdsh not found on PATH but DeepSpeed's pdsh runner was asked for"]
    no_mpirun = ds_plan(binaries={"mpirun": ""})
    assert no_mpirun.problems == ["mpirun not found on PATH for DeepSpeed's openmpi runner"]
    node = facts(versions={})
    nothing = plan.make_plan(config.load(dict(BATCH_MAIN, MNP_LAUNCHER="deepspeed")), node,
                             ["python3", "train.py"], {"PATH": "/bin"})
    assert "deepspeed not found on PATH: install DeepSpeed or set MNP_LAUNCHER" in nothing.problems
    module = plan.make_plan(config.load(dict(BATCH_MAIN, MNP_LAUNCHER="deepspeed")),
                            facts(versions={"deepspeed": "0.14.4"}), ["python3", "t.py"],
                            {"PATH": "/bin"})
    assert module.problems == [] and module.argv[:3] == ["python3", "-m",
                                                        "deepspeed.launcher.runner"]
    assert ds_plan().argv[0] == "deepspeed"


def test_deepspeed_single_node_skips_its_ssh_check_from_065():
    single = {"MNP_SECRET": "s"}
    assert "--no_ssh_check" in ds_plan(env=single).argv
    assert "--no_ssh_check" not in ds_plan(env=single, version="0.6.1").argv
    assert "--no_ssh_check" not in ds_plan().argv  # Batch's main node: the runner needs SSH


def test_deepspeed_env_file_path_reason_and_unsafe_values():
    user = {"PATH": "/bin", "SAFE": "a/b:c", "UNSAFE": "two words"}
    new = ds_plan(user_env=user)
    env_file = next(f for f in new.files if f["path"] == "/run/mnp/deepspeed_env")
    assert env_file["why"] == "variables DeepSpeed exports to every node (DS_ENV_FILE)"
    assert "SAFE=a/b:c\n" in env_file["content"] and "UNSAFE" not in env_file["content"]
    assert ("not in DeepSpeed's env file (the value would need shell quoting in pdsh's remote "
            "command): UNSAFE") in new.notes
    assert new.environment["DS_ENV_FILE"] == "/run/mnp/deepspeed_env"
    old = ds_plan(version="0.6.1")
    assert old.launcher["env_propagation"] == "~/.deepspeed_env (DeepSpeed 0.6.1 reads no DS_ENV_FILE)"
    assert any(f["path"] == "/root/.deepspeed_env" for f in old.files)
    assert "DS_ENV_FILE" not in old.environment
    unknown = ds_plan(version=None)
    assert unknown.launcher["env_propagation"] == (
        "~/.deepspeed_env (DeepSpeed of unknown version reads no DS_ENV_FILE)")
    clean = ds_plan(user_env={"PATH": "/bin"})
    assert not any(note.startswith("not in DeepSpeed's env file") for note in clean.notes)


def test_torch_distributed_launch_runs_where_slurm_started_each_node():
    node = facts(versions={"pytorch": "1.4.0"}, gpus=2, slots=2)
    p = plan.make_plan(config.load(dict(SRUN_MAIN, MNP_LAUNCHER="torchrun")), node,
                       ["python3", "train.py"], {"PATH": "/bin"})
    assert p.launcher["unit"] == "torch.distributed.launch" and p.problems == []
    named = plan.make_plan(config.load(dict(SRUN_MAIN, MNP_LAUNCHER="torch.distributed.launch")),
                           node, ["python3", "train.py"], {"PATH": "/bin"})
    assert named.launcher["unit"] == "torch.distributed.launch" and named.problems == []


# -- Open MPI parameters ----------------------------------------------------------------------
def test_mca_pairs_leave_the_other_arguments_in_order():
    assert mca.split_args(["-x", "A", "--mca", "btl", "tcp", "--oversubscribe", "-mca", "pml",
                           "ob1"]) == ([("btl", "tcp"), ("pml", "ob1")], ["-x", "A",
                                                                           "--oversubscribe"])
    with pytest.raises(mca.McaError) as caught:
        mca.split_args(["--mca", "bad-name", "1"])
    assert str(caught.value) == "--mca 'bad-name': not a parameter name"
    with pytest.raises(mca.McaError, match="^-mca needs a name and a value$"):
        mca.split_args(["-mca", "btl"])
    assert mca.from_env({"OMPI_MCA_": "x", "OMPI_MCA_pml": "ucx", "PATH": "/"}) == [("pml", "ucx")]


def test_runner_conflicts_ignore_a_name_nobody_set():
    params = mca.merge([("pml", "ob1")], {}, [])
    assert mca.runner_conflicts(params) == ([], [])


def test_mca_from_launcher_args_becomes_a_variable_that_replaces_ours():
    p = make(BATCH_MAIN, MNP_LAUNCHER="mpirun",
             MNP_LAUNCHER_ARGS="--mca btl_tcp_if_include eth1 --mca coll_hcoll_enable 0 -x FOO")
    assert "--mca" not in p.argv and " -x FOO python3 train.py" in " ".join(p.argv)
    replaced = next(e for e in p.env if e["name"] == "OMPI_MCA_btl_tcp_if_include")
    assert (replaced["value"], replaced["reason"]) == (
        "eth1", "--mca btl_tcp_if_include from MNP_LAUNCHER_ARGS (replaces ours: eth0)")
    new = next(e for e in p.env if e["name"] == "OMPI_MCA_coll_hcoll_enable")
    assert (new["value"], new["reason"]) == ("0", "--mca coll_hcoll_enable from MNP_LAUNCHER_ARGS")
    assert p.environment["OMPI_MCA_btl_tcp_if_include"] == "eth1"
    assert "btl_tcp_if_include=eth1 from MNP_LAUNCHER_ARGS (ours: eth0)" in p.kept
    ours = next(e for e in p.env if e["name"] == "OMPI_MCA_pml")
    assert ours["value"] == "ob1" and ours["source"] == ""


def test_a_malformed_mca_is_a_plan_problem():
    p = make(BATCH_MAIN, MNP_LAUNCHER="mpirun", MNP_LAUNCHER_ARGS="--mca btl")
    assert "MNP_LAUNCHER_ARGS: --mca needs a name and a value" in p.problems


def test_the_users_mca_variable_wins_and_ours_follow_the_wiring():
    node = facts()
    cfg = config.load(dict(BATCH_MAIN, MNP_LAUNCHER="mpirun"))
    p = plan.make_plan(cfg, node, ["python3", "t.py"], {"PATH": "/bin", "OMPI_MCA_pml": "ucx"})
    assert p.environment["OMPI_MCA_pml"] == "ucx" and ["pml", "ucx", "OMPI_MCA_pml"] in p.mca
    names = [m[0] for m in p.mca]
    assert "plm_rsh_args" in names and "orte_default_hostfile" not in names  # dry run: no hostfile
    from entrypoint.core.nodes import NodeInfo

    table = [NodeInfo(0, "10.0.0.5", 1, ""), NodeInfo(1, "10.0.0.6", 1, "")]
    wired = plan.make_plan(cfg, node, ["python3", "t.py"], {"PATH": "/bin"}, table=table,
                           hostfiles={"openmpi": "/run/mnp/hostfile", "plain": "p", "intel": "i"})
    assert ["orte_default_hostfile", "/run/mnp/hostfile", "ours"] in wired.mca
    torchrun = make(SRUN_MAIN, MNP_LAUNCHER="none")
    assert "plm_rsh_args" not in [m[0] for m in torchrun.mca]


# -- torchrun ---------------------------------------------------------------------------------
def test_an_elastic_peers_line_and_the_pet_variables_it_clears():
    env = {"PET_RDZV_ENDPOINT": "etcd:2379", "PET_NNODES": "1:3", "PET_RDZV_BACKEND": "etcd",
           "PET_RDZV_ID": "job-1", "PET_MAX_RESTARTS": "3", "PET_RDZV_CONF": "timeout=900"}
    node = facts(versions={"pytorch": "2.3.1"})
    p = plan.make_plan(config.load(env), node, ["python3", "t.py"], dict(env, PATH="/bin"))
    line = " ".join(p.argv)
    assert ("--nnodes 1:3 --nproc_per_node 1 --rdzv_backend etcd --rdzv_endpoint etcd:2379 "
            "--rdzv_id job-1 --max_restarts 3 --rdzv_conf timeout=900 t.py") in line
    assert not any(name.startswith("PET_") for name in p.environment)
    assert ("cleared PET_MAX_RESTARTS, PET_NNODES, PET_RDZV_BACKEND, PET_RDZV_CONF, PET_RDZV_ENDPOINT, "
            "PET_RDZV_ID: torchrun's command line carries what they say") in " ".join(p.notes)
    plain = make(SRUN_MAIN, MNP_LAUNCHER="torchrun")
    assert not any(note.startswith("cleared PET_") for note in plain.notes)
    bare = plan.make_plan(config.load({"PET_RDZV_ENDPOINT": "etcd:2379", "PET_NNODES": "2"}), node,
                          ["python3", "t.py"], {"PATH": "/bin"})
    assert not {"--rdzv_id", "--max_restarts", "--rdzv_conf"} & set(bare.argv), bare.argv


def test_pytorch_before_19_says_why_it_uses_distributed_launch():
    p = plan.make_plan(config.load(dict(SRUN_MAIN, MNP_LAUNCHER="torchrun")),
                       facts(versions={"pytorch": "1.4.0"}), ["python3", "t.py"], {"PATH": "/bin"})
    assert ("PyTorch 1.4.0 has no torch.distributed.run (new in 1.9.0): using "
            "torch.distributed.launch") in p.notes

"""Launcher command construction."""

import pytest

from entrypoint import launchers as launch

ENV = {"PATH": "/usr/bin", "LD_LIBRARY_PATH": "/x", "NCCL_DEBUG": "INFO", "FI_PROVIDER": "efa",
       "OFI_NCCL_X": "1", "HOME": "/root", "WANDB_API_KEY": "k", "HF_HOME": "/h", "HF_TOKEN": "t",
       "PYTHONPATH": "/p", "GLOO_SOCKET_IFNAME": "eth0"}


def test_export_names_forward_the_job_environment():
    """Issue 12, Medium 4: every variable of the job reaches the other nodes' ranks (the old
    code forwarded only NCCL/FI/OFI/HCCL and path variables), except the node-specific ones."""
    env = dict(ENV, AWS_REGION="eu-west-1", MY_JOB_SETTING="42",
               AWS_CONTAINER_CREDENTIALS_RELATIVE_URI="/v2/credentials/x", HOSTNAME="ip-10-0-0-5",
               AWS_BATCH_JOB_NODE_INDEX="0", ECS_CONTAINER_METADATA_URI_V4="http://169.254.170.2/v4/a",
               MNP_SECRET="s", MNP_SECRET_FILE="/f", OMPI_COMM_WORLD_RANK="0", PWD="/w",
               NVIDIA_VISIBLE_DEVICES="GPU-1", **{"BASH_FUNC_f%%": "() { :; }"})
    names = launch.base.export_names(env)
    assert {"AWS_REGION", "MY_JOB_SETTING", "NCCL_DEBUG", "PATH", "LD_LIBRARY_PATH", "HF_TOKEN",
            "HOME"} <= set(names)
    # per ECS task: each node's sshd gives the ranks that node's own value (ssh.NODE_SSH_ENV)
    for name in ("HOSTNAME", "AWS_BATCH_JOB_NODE_INDEX", "ECS_CONTAINER_METADATA_URI_V4",
                 "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
                 "MNP_SECRET", "MNP_SECRET_FILE", "OMPI_COMM_WORLD_RANK", "PWD",
                 "NVIDIA_VISIBLE_DEVICES", "BASH_FUNC_f%%"):
        assert name not in names
    assert names == sorted(names)
    forced = launch.base.export_names(env, ["NVIDIA_VISIBLE_DEVICES", "MISSING", "MNP_SECRET"])
    assert "NVIDIA_VISIBLE_DEVICES" in forced and "MISSING" not in forced
    assert "MNP_SECRET" not in forced


def test_mpirun_as_root():
    argv = launch.mpirun.command_line("/usr/bin/mpirun", ["python3", "train.py", "--lr", "1"], 16,
                                      "/run/mnp/hostfile", ["NCCL_DEBUG", "PATH"], is_root=True)
    assert argv[:2] == ["/usr/bin/mpirun", "--allow-run-as-root"]
    assert argv[argv.index("-np") + 1] == "16"
    assert argv[argv.index("--hostfile") + 1] == "/run/mnp/hostfile"
    joined = " ".join(argv)
    assert "--tag-output" not in argv  # issue 43: it cuts long lines; only with MNP_TAG_OUTPUT=1
    assert "-x NCCL_DEBUG -x PATH" in joined
    tagged = launch.mpirun.command_line("/usr/bin/mpirun", ["python3", "train.py"], 16, "/h",
                                        [], is_root=True, tag_output=True)
    assert tagged.count("--tag-output") == 1
    assert argv[-4:] == ["python3", "train.py", "--lr", "1"]


def test_mpirun_not_root_and_user_np():
    argv = launch.mpirun.command_line("mpirun", ["./a.out"], 16, "/h", [],
                                      launcher_args=["-np", "4", "--tag-output"], is_root=False)
    assert "--allow-run-as-root" not in argv
    assert argv.count("-np") == 1 and argv[argv.index("-np") + 1] == "4"
    assert argv[-2:] == ["--tag-output", "./a.out"] and argv.count("--tag-output") == 1


def test_mpirun_script_gets_python():
    argv = launch.mpirun.command_line("mpirun", ["train.py", "--x"], 2, "/h", [])
    assert argv[-3:] == ["python3", "train.py", "--x"]


@pytest.mark.parametrize("command,kind,rest", [
    (["python3", "train.py", "a"], "script", ["train.py", "a"]),
    (["/usr/bin/python3.11", "train.py"], "script", ["train.py"]),
    (["train.py", "a"], "script", ["train.py", "a"]),
    (["python", "-m", "pkg.train", "a"], "module", ["pkg.train", "a"]),
    (["python3", "-u", "train.py"], "exec", ["python3", "-u", "train.py"]),
    (["./run.sh", "a"], "exec", ["./run.sh", "a"]),
    (["bash", "-c", "python3 x.py"], "exec", ["bash", "-c", "python3 x.py"]),
])
def test_split_program(command, kind, rest):
    assert launch.base.split_program(command) == (kind, rest)


def test_torchrun_both_forms_work():
    common = dict(nnodes=3, node_rank=2, nproc=8, master_addr="10.0.0.10", master_port=29500)
    a = launch.torchrun.command_line(["torchrun"], ["python3", "train.py", "--lr", "1"], **common)
    b = launch.torchrun.command_line(["torchrun"], ["train.py", "--lr", "1"], **common)
    assert a == b == ["torchrun", "--nnodes", "3", "--node_rank", "2", "--nproc_per_node", "8",
                      "--master_addr", "10.0.0.10", "--master_port", "29500",
                      "train.py", "--lr", "1"]
    module = launch.torchrun.command_line(["torchrun"], ["python3", "-m", "pkg"], **common)
    assert module[-2:] == ["-m", "pkg"]
    other = launch.torchrun.command_line(["torchrun"], ["./run.sh"], **common)
    assert other[-2:] == ["--no_python", "./run.sh"]


def test_deepspeed():
    argv = launch.deepspeed.command_line(["deepspeed"], ["python3", "train.py", "--ds"],
                                 "/run/mnp/hostfile", "openmpi", "10.0.0.10", 29500,
                                 "--allow-run-as-root -mca x y")
    assert argv == ["deepspeed", "--hostfile", "/run/mnp/hostfile", "--launcher", "openmpi",
                    "--master_addr", "10.0.0.10", "--master_port", "29500",
                    "--launcher_args=--allow-run-as-root -mca x y", "train.py", "--ds"]
    other = launch.deepspeed.command_line(["deepspeed"], ["./run.sh"], "/h", "pdsh", "a", 1)
    assert other[-3:] == ["--no_python", "--no_local_rank", "./run.sh"]
    module = launch.deepspeed.command_line(["deepspeed"], ["python3", "-m", "pkg"], "/h", "pdsh", "a", 1)
    assert module[-2:] == ["--module", "pkg"]

"""The entrypoint as a process: exit codes, dry runs, and a multi-node job on this host.

The multi-node tests run the main node and its children as processes on this machine, with a
fake ``torchrun`` on PATH that records its arguments (the real one runs in the Docker
integration tests)."""

import json
import os
import re
import signal
import time

import pytest


@pytest.fixture
def run(local_node):
    """The entrypoint run to its end on this host (text output)."""
    return local_node.run


@pytest.fixture
def start(local_node):
    """The entrypoint started on this host, stopped after the test."""
    return local_node.start


@pytest.mark.parametrize("env,variable", [
    ({"MNP_LAUNCHER": "srun"}, "MNP_LAUNCHER"),
    ({"AWS_BATCH_JOB_NODE_INDEX": "x", "AWS_BATCH_JOB_MAIN_NODE_INDEX": "0",
      "AWS_BATCH_JOB_NUM_NODES": "2"}, "AWS_BATCH_JOB_NODE_INDEX"),
    ({"AWS_BATCH_JOB_NODE_INDEX": "2", "AWS_BATCH_JOB_MAIN_NODE_INDEX": "0",
      "AWS_BATCH_JOB_NUM_NODES": "2"}, "AWS_BATCH_JOB_NODE_INDEX"),
    ({"AWS_BATCH_JOB_NODE_INDEX": "1", "AWS_BATCH_JOB_MAIN_NODE_INDEX": "0",
      "AWS_BATCH_JOB_NUM_NODES": "2"}, "AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS"),
    ({"MNP_NETWORK_INTERFACE": "nosuchif0"}, "MNP_NETWORK_INTERFACE"),
    ({"MNP_LAUCHER": "torchrun"}, "MNP_LAUCHER"),  # a typo in our namespace (issue 16 item 4)
    ({"MNP_INSTANCE_TYPE": "p5.48xlarg"}, "MNP_INSTANCE_TYPE"),
])
def test_invalid_values_exit_2_with_one_line(run, env, variable):
    result = run(["true"], **env)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if "error" in line]
    assert len(errors) == 1 and variable in errors[0]


@pytest.mark.parametrize("batch", [
    {},
    {"AWS_BATCH_JOB_NODE_INDEX": "0", "AWS_BATCH_JOB_MAIN_NODE_INDEX": "0",
     "AWS_BATCH_JOB_NUM_NODES": "2"},
    {"AWS_BATCH_JOB_NODE_INDEX": "1", "AWS_BATCH_JOB_MAIN_NODE_INDEX": "0",
     "AWS_BATCH_JOB_NUM_NODES": "2", "AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS": "10.0.0.9"},
    {"AWS_BATCH_JOB_NODE_INDEX": "1", "AWS_BATCH_JOB_MAIN_NODE_INDEX": "0",
     "AWS_BATCH_JOB_NUM_NODES": "2", "AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS": "10.0.0.9",
     "MNP_LAUNCHER": "torchrun"},
], ids=["single", "main", "child-mpirun", "child-torchrun"])
def test_no_command_is_a_usage_error_on_every_node(run, batch):
    """Issue 16 item 1: a child of an SSH launcher used to start without a command and serve
    SSH; now every node stops with one line saying where the command goes."""
    result = run([], **batch)
    assert result.returncode == 2
    errors = [line for line in result.stderr.splitlines() if "error" in line]
    assert len(errors) == 1 and "no command given" in errors[0], result.stderr
    assert "containerProperties.command" in errors[0] and "invoke jobdef ... --" in errors[0]


def test_single_node_runs_the_command_and_keeps_its_exit_code(run):
    assert run(["sh", "-c", "exit 3"]).returncode == 3
    assert run(["sh", "-c", "kill -KILL $$"]).returncode == 137
    result = run(["sh", "-c", "echo hello"])
    assert result.returncode == 0 and result.stdout == "hello\n"


def test_missing_program_is_127(run):
    assert run(["/nonexistent/program"]).returncode == 127


def test_sigterm_is_forwarded_and_exit_is_143(start):
    proc = start(["sh", "-c", "trap 'echo got-term; exit 0' TERM; echo trap-set; "
                              "sleep 30 & wait"])
    # signal once the command's trap is in place (a fixed sleep lost the race on a busy host)
    seen = []
    while not any("trap-set" in line for line in seen):
        line = proc.stdout.readline()
        assert line, "".join(seen)
        seen.append(line)
    time.sleep(0.5)  # and the shell is in its ``wait``
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=20)
    assert proc.returncode == 143
    assert "got-term" in out


@pytest.fixture
def tools(local_node):
    """A PATH with stand-ins for mpirun and sshd first: a plan without problems (a dry run of
    a plan with problems exits 1) whatever this host has installed."""
    local_node.fake_program("sshd", "#!/bin/sh\nexit 0\n")
    bindir = local_node.fake_program("mpirun", "#!/bin/sh\nexit 0\n")
    return f"{bindir}:{os.environ.get('PATH', '/usr/bin:/bin')}"


def test_single_node_mpirun_dry_run_with_slots(run, tmp_path, tools):
    result = run(["python3", "train.py"], MNP_DRY_RUN="1", MNP_SLOTS_PER_NODE="4",
                 MNP_STATE_DIR=str(tmp_path / "state"), PATH=tools)
    assert result.returncode == 0, result.stderr
    assert "localhost slots=4" in result.stdout
    assert "-np 4" in result.stdout
    assert not (tmp_path / "state").exists()


BATCH = {"AWS_BATCH_JOB_MAIN_NODE_INDEX": "0", "AWS_BATCH_JOB_NUM_NODES": "3",
         "AWS_BATCH_JOB_ID": "job-42"}


def test_dry_run_on_main_node_prints_a_complete_plan(run, tmp_path, tools):
    result = run(["python3", "train.py", "--lr", "0.1"], MNP_DRY_RUN="1", PATH=tools,
                 AWS_BATCH_JOB_NODE_INDEX="0", MNP_SECRET="topsecret",
                 MNP_STATE_DIR=str(tmp_path / "state"), **BATCH)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    for needle in ("role: main", "address:", "devices: 1 slot(s)", "fabric TCP",
                   "rendezvous: listen on port 29410", "nodes 1, 2", "slots=1",
                   "command: ", "mpirun", "--hostfile", "train.py --lr 0.1",
                   "GLOO_SOCKET_IFNAME=", "full environment"):
        assert needle in out, needle
    assert "topsecret" not in out
    assert not (tmp_path / "state").exists()


def test_dry_run_on_child_node_prints_a_complete_plan(run, tools):
    result = run(["python3", "train.py"], MNP_DRY_RUN="1", AWS_BATCH_JOB_NODE_INDEX="2",
                 PATH=tools,
                 AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS="10.1.2.3", **BATCH)
    assert result.returncode == 0, result.stderr
    for needle in ("role: child, node 2 of 3", "register with 10.1.2.3:29410",
                   "secret NOT SET", "sshd on port 2222", "command: none on this node"):
        assert needle in result.stdout, needle
    torch = run(["python3", "train.py"], MNP_DRY_RUN="1", MNP_LAUNCHER="torchrun",
                AWS_BATCH_JOB_NODE_INDEX="2",
                AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS="10.1.2.3", **BATCH)
    assert "--node_rank 2" in torch.stdout and "--master_addr 10.1.2.3" in torch.stdout


def bare_path(tmp_path):
    """A PATH with no launcher on it: no test may depend on the host's mpirun."""
    empty = tmp_path / "emptybin"
    empty.mkdir(exist_ok=True)
    return str(empty)


def test_fault5_dry_run_without_mpirun_is_a_plan_with_a_problem_line(run, tmp_path):
    result = run(["python3", "train.py"], MNP_DRY_RUN="1", AWS_BATCH_JOB_NODE_INDEX="0",
                 PATH=bare_path(tmp_path), MNP_STATE_DIR=str(tmp_path / "state"), **BATCH)
    # the plan is printed in full, and the exit code says a real run would stop (as explain)
    assert result.returncode == 1, result.stderr
    assert "PROBLEM (a real run stops here): mpirun not found on PATH" in result.stdout
    assert "command: mpirun " in result.stdout
    # the same plan, run for real on a single node, stops with that line as its error
    real = run(["python3", "train.py"], MNP_SLOTS_PER_NODE="2", PATH=bare_path(tmp_path),
               MNP_STATE_DIR=str(tmp_path / "state2"))
    assert real.returncode == 2  # configuration: the image lacks the launcher, never retried
    assert "error: mpirun not found on PATH" in real.stderr
    assert real.stderr.splitlines()[-1].endswith(
        "exit 2 (configuration on node 0): mpirun not found on PATH: install Open MPI or set "
        "MNP_LAUNCHER; not retried: fix the job")


def test_json_dry_run(run, tmp_path):
    result = run(["python3", "train.py"], MNP_DRY_RUN="json", AWS_BATCH_JOB_NODE_INDEX="0",
                 PATH=bare_path(tmp_path), MNP_SECRET="topsecret", **BATCH)
    assert result.returncode == 1, result.stderr  # a problem: the same rule as invoke explain
    data = json.loads(result.stdout)
    assert data["version"] == 2 and data["role"]["mode"] == "main"
    assert data["launcher"]["unit"] == "mpirun" and data["argv"][-2:] == ["python3", "train.py"]
    assert data["problems"][0].startswith("mpirun not found")
    assert "topsecret" not in result.stdout


FAKE_MPIRUN = """#!/bin/sh
printf '%s\n' "$0" "$@" > "$FAKE_OUT"
"""


def test_the_run_executes_exactly_the_dry_run_plan(run, local_node, tmp_path):
    bindir = local_node.fake_program("mpirun", FAKE_MPIRUN)
    settings = dict(MNP_SLOTS_PER_NODE="3", MNP_STATE_DIR=str(tmp_path / "state"),
                    PATH=f"{bindir}:/usr/bin:/bin", FAKE_OUT=str(tmp_path / "argv"))
    dry = run(["python3", "train.py", "--x"], MNP_DRY_RUN="json", **settings)
    planned = json.loads(dry.stdout)
    real = run(["python3", "train.py", "--x"], **settings)
    assert real.returncode == 0, real.stderr
    ran = (tmp_path / "argv").read_text().splitlines()
    assert ran == planned["argv"]
    assert planned["problems"] == []


# -- a multi-node job of processes on this host -----------------------------------------------

FAKE_TORCHRUN = """#!/bin/sh
echo "$MNP_NODE_INDEX $*" > "$FAKE_OUT/node$MNP_NODE_INDEX"
if [ "$MNP_NODE_INDEX" = "$FAKE_FAIL_NODE" ]; then exit 5; fi
if [ -n "$FAKE_SLEEP" ]; then sleep "$FAKE_SLEEP"; fi
exit 0
"""


@pytest.fixture
def job(local_node, tmp_path):
    main_addr = local_node.address()
    bindir = local_node.fake_program("torchrun", FAKE_TORCHRUN)
    outdir = tmp_path / "out"
    outdir.mkdir()
    port, master_port = local_node.free_port(), local_node.free_port()

    def node(index, num=3, **extra):
        env = dict(AWS_BATCH_JOB_NODE_INDEX=str(index), AWS_BATCH_JOB_MAIN_NODE_INDEX="0",
                   AWS_BATCH_JOB_NUM_NODES=str(num), AWS_BATCH_JOB_ID="job-7",
                   MNP_LAUNCHER="torchrun", MNP_SECRET="s3", MNP_RENDEZVOUS_PORT=str(port),
                   MNP_MASTER_PORT=str(master_port), MNP_HEARTBEAT_TIMEOUT="10",
                   MNP_STATE_DIR=str(tmp_path / f"state{index}"), FAKE_OUT=str(outdir),
                   PATH=f"{bindir}:{os.environ['PATH']}")
        if index != 0:
            env["AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS"] = main_addr
        env.update(extra)
        return local_node.start(["python3", "train.py", "--epochs", "1"], **env)

    node.main_addr = main_addr
    node.outdir = outdir
    return node


def finish(proc, timeout=60):
    out, _ = proc.communicate(timeout=timeout)
    return proc.returncode, out


def test_local_job_succeeds(job):
    children = [job(2), job(1)]  # children first, in reverse order
    time.sleep(0.5)
    main = job(0)
    code, out = finish(main)
    assert code == 0, out
    for child in children:
        code, out = finish(child)
        assert code == 0, out
    for index in range(3):
        args = (job.outdir / f"node{index}").read_text().split()
        assert args[0] == str(index)
        assert args[args.index("--node_rank") + 1] == str(index)
        assert args[args.index("--nnodes") + 1] == "3"
        assert args[args.index("--master_addr") + 1] == job.main_addr
        assert args[-3:] == ["train.py", "--epochs", "1"]


def test_local_job_fails_when_a_child_fails(job):
    main = job(0, FAKE_FAIL_NODE="2", FAKE_SLEEP="20")
    child1 = job(1, FAKE_FAIL_NODE="2", FAKE_SLEEP="20")
    job(2, FAKE_FAIL_NODE="2", FAKE_SLEEP="20")
    start_time = time.time()
    code, out = finish(main)
    assert code == 5  # the user's own status, from the node where the command failed
    assert "node 2 failed (exit code 5)" in out
    # node 2's address is what its own route lookup found (the machine's, not the fixture's)
    assert re.search(r"exit 5 \(user on node 2 [0-9.]+\): the command on node 2 exited with 5; "
                     r"not retried$", out.splitlines()[-1]), out.splitlines()[-1]
    code, out = finish(child1)  # told to stop: its launcher is stopped, it exits promptly
    assert "job ended" in out
    assert time.time() - start_time < 18


def test_local_job_names_a_missing_child(job):
    # 10 s: node 1 must register before the main node gives up, however slowly both start
    main = job(0, MNP_WAIT_TIMEOUT="10")
    child = job(1, MNP_WAIT_TIMEOUT="10")
    code, out = finish(main)
    assert code == 200  # infrastructure: a retry on other hosts can fix it
    assert "node(s) 2 never registered" in out
    assert re.search(r"exit 200 \(infrastructure on node 2\): node\(s\) 2 never registered "
                     r"within 10s .*retryable on other hosts$", out.splitlines()[-1])
    code, out = finish(child)
    assert "job ended" in out


def test_local_job_rejects_the_wrong_secret(job):
    main = job(0, num=2, MNP_WAIT_TIMEOUT="10")  # the intruder must be heard before it ends
    intruder = job(1, num=2, MNP_SECRET="wrong")
    code, out = finish(intruder)
    assert code == 2 and "MNP_SECRET" in out  # configuration: another secret is never retried
    code, out = finish(main)
    assert code == 200
    assert "rejected registration" in out and "authentication failed" in out


def test_efa_without_devices_on_every_node_is_configuration(job):
    """This host has no EFA device, so no node of the job has one: the job definition passes
    none, the same on any host, so the main node ends it as configuration (not retried); no
    launcher starts anywhere."""
    nodes = [job(1, MNP_FABRIC="efa"), job(0, MNP_FABRIC="efa"), job(2, MNP_FABRIC="efa")]
    code, out = finish(nodes[1])
    assert code == 2, out
    assert re.search(r"exit 2 \(configuration on node 0,1,2\): no node has an EFA device", out)
    for child in (nodes[0], nodes[2]):
        code, out = finish(child)
        assert code == 2 and "found the same on every node" in out, out
    assert list(job.outdir.iterdir()) == []  # the fake torchrun ran nowhere

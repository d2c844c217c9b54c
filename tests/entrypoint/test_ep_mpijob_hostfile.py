"""The MPIJob launcher's hostfile (issue 25): without it the launcher knows no worker, which is a
plan problem (the dry run shows the plan with its PROBLEM line, a real run stops with one line
naming the variable, the path and what the operator mounts there), not ``mpirun -np 1``."""

import os
from pathlib import Path

import pytest

from entrypoint.core.errors import ConfigError
from entrypoint.plan import make as plan
from entrypoint.probe.facts import NodeFacts
from entrypoint.schedulers import mpijob
from entrypoint.settings import config

BINARIES = {"mpirun": "/usr/bin/mpirun", "sshd": "/usr/sbin/sshd", "python3": "/usr/bin/python3"}
WHAT_TO_MOUNT = ("so this MPIJob launcher knows no worker: the MPI operator mounts the job's "
                 "ConfigMap (<job>-config; a TrainJob's <trainjob>-mpi-hostfile) with its hostfile "
                 "at /etc/mpi on the launcher pod only")


def launcher_env(hostfile):
    return dict(mpijob.example(2), OMPI_MCA_orte_default_hostfile=str(hostfile))


def planned(env):
    facts = NodeFacts(address="10.0.0.5", interface="eth0", is_root=True,
                      binaries=dict(BINARIES), slots=1)
    return plan.make_plan(config.load(env), facts, ["python3", "train.py"], {"PATH": "/bin"})


def test_a_launcher_without_the_hostfile_is_a_problem_first(tmp_path):
    missing = tmp_path / "hostfile"
    p = planned(launcher_env(missing))
    assert p.problems[0] == (
        f"OMPI_MCA_orte_default_hostfile={str(missing)!r} is not there, {WHAT_TO_MOUNT}; run "
        "this as the launcher of an MPIJob, or mount a hostfile that lists the workers and name "
        "it in OMPI_MCA_orte_default_hostfile")


def test_a_directory_where_the_hostfile_should_be_is_not_a_file(tmp_path):
    p = planned(launcher_env(tmp_path))
    assert p.problems and f"{str(tmp_path)!r} is not a file, " in p.problems[0]


@pytest.mark.skipif(Path(mpijob.DEFAULT_HOSTFILE).exists(), reason="this host has the file")
def test_without_a_hostfile_variable_the_default_path_is_named():
    p = planned({"K_MPI_JOB_ROLE": "launcher"})
    assert p.problems[0].startswith("K_MPI_JOB_ROLE=launcher: /etc/mpi/hostfile (the operator's "
                                    "default) is not there, " + WHAT_TO_MOUNT)


def test_the_launcher_with_its_hostfile_has_no_such_problem(tmp_path):
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("job-worker-0.job.default.svc slots=1\njob-worker-1.job.default.svc slots=1\n")
    p = planned(launcher_env(hostfile))
    assert p.problems == [] and "-np 2" in " ".join(p.argv)


@pytest.fixture
def mpirun_path(local_node):
    """mpirun and sshd stand-ins (mpirun records that it ran): the hostfile is the only problem."""
    local_node.fake_program("sshd", "#!/bin/sh\nexit 0\n")
    bindir = local_node.fake_program("mpirun", f"#!/bin/sh\ntouch {local_node.tmp_path}/ran\n")
    return f"{bindir}:{os.environ.get('PATH', '/usr/bin:/bin')}"


def test_the_dry_run_away_from_the_pod_shows_the_plan_with_the_problem(local_node, mpirun_path):
    env = launcher_env(local_node.tmp_path / "hostfile")
    result = local_node.run(["python3", "train.py"], MNP_DRY_RUN="1", PATH=mpirun_path, **env)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "command: " in result.stdout and "mpirun --allow-run-as-root -np 1 " in result.stdout
    problems = [line for line in result.stdout.splitlines() if line.startswith("PROBLEM")]
    assert len(problems) == 1 and WHAT_TO_MOUNT in problems[0]


def test_a_real_launcher_without_the_hostfile_stops_with_one_line(local_node, mpirun_path):
    env = launcher_env(local_node.tmp_path / "hostfile")
    result = local_node.run(["python3", "train.py"], PATH=mpirun_path, **env)
    assert result.returncode == 2 and "Traceback" not in result.stderr  # configuration
    errors = [line for line in result.stderr.splitlines() if "error" in line]
    assert len(errors) == 1 and "OMPI_MCA_orte_default_hostfile=" in errors[0], result.stderr
    assert WHAT_TO_MOUNT in errors[0]
    assert not (local_node.tmp_path / "ran").exists()  # mpirun never started


# -- host names in an operator's hostfile (RFC 1123 names, IP literals) -------------------------

@pytest.mark.parametrize("host", [
    "host;", "w-0;rm", "-w0", "w0-", "a..b", "w_0", "$(x)", "x" * 64 + ".svc", "1.2.3.999",
    "10.0.0", ".", "w0.example..com",
])
def test_a_host_that_is_no_name_or_address_is_one_line_naming_the_file_and_line(tmp_path, host):
    hostfile = tmp_path / "hostfile"
    hostfile.write_text(f"job-worker-0.job.default.svc slots=1\n{host} slots=1\n")
    with pytest.raises(ConfigError) as info:
        config.load(launcher_env(hostfile))
    assert str(info.value) == (
        f"OMPI_MCA_orte_default_hostfile: {str(hostfile)!r} line 2: {host!r} is not a host name "
        "(RFC 1123: dot-separated labels of letters, digits and inner '-', at most 63 characters "
        "each) or an IP address")


@pytest.mark.parametrize("line, host, slots", [
    ("job-worker-0.job.default.svc slots=8", "job-worker-0.job.default.svc", 8),
    ("10.0.0.7 slots=2", "10.0.0.7", 2), ("fd00::7 slots=2", "fd00::7", 2),
    ("w0.example.com. slots=1", "w0.example.com.", 1), ("4worker:4", "4worker", 4),
    ("W-0.Job.ns.svc", "W-0.Job.ns.svc", None),
])
def test_rfc_1123_names_and_ip_literals_are_hosts(tmp_path, line, host, slots):
    hostfile = tmp_path / "hostfile"
    hostfile.write_text(line + "\n")
    hosts, counts = mpijob.read_hostfile(str(hostfile), "OMPI_MCA_orte_default_hostfile")
    assert hosts == [host] and counts == (None if slots is None else [slots])


def test_a_bad_host_never_reaches_deepspeeds_master_addr(local_node):
    """``host;`` used to become ``deepspeed --master_addr 'host;'`` (the first host is the master)."""
    hostfile = local_node.tmp_path / "hostfile"
    hostfile.write_text("host; slots=1\njob-worker-1.job.default.svc slots=1\n")
    env = dict(launcher_env(hostfile), MNP_LAUNCHER="deepspeed")
    result = local_node.run(["python3", "train.py"], MNP_DRY_RUN="1", **env)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "--master_addr" not in result.stdout
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].endswith(
        f"OMPI_MCA_orte_default_hostfile: {str(hostfile)!r} line 1: 'host;' is not a host name "
        "(RFC 1123: dot-separated labels of letters, digits and inner '-', at most 63 characters "
        "each) or an IP address"), lines

"""Issue 24 "Done when", in ``invoke run --nodes 3`` rehearsals of the real ``cpu-tcp`` image
(``matrix.jobs.rehearse``, the code behind ``invoke run``): each failure class ends the job with
its own code and one line naming the node and the reason, and ``--attempts`` retries only the
infrastructure code.

Faults are made the way a bad host makes them: a node whose container never runs the entrypoint
(it never joins), fake GPU device nodes (one fewer on one node than the instance type promises),
and a tc qdisc throttling one node's link on the network the rehearsal made.
"""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from entrypoint.core import errors
from matrix.jobs.mounts import Mount
from matrix.jobs.rehearse import rehearse

pytestmark = [pytest.mark.docker]
ROOT = Path(__file__).resolve().parents[2]
SHOW_ATTEMPT = ["python3", "-c", "import os; print('attempt', os.environ['MNP_ATTEMPT'])"]
EXIT3 = ["python3", "-c", "import sys; sys.exit(3)"]


class Lines(list):
    def __call__(self, line):
        self.append(line)

    def attempts(self):
        return [line for line in self if re.match(r"attempt \d+/\d+: exit", line)]


def run(docker_client, image, tmp_path, command, env=None, **kwargs):
    mounts = []
    if os.environ.get("MNP_TEST_MOUNT_ENTRYPOINT") == "1":  # develop against this checkout
        mounts.append(Mount(str(ROOT / "entrypoint"), "/opt/mnp/lib/entrypoint", True))
    lines = Lines()
    code = rehearse(docker_client, image, 3, command, None, dict(env or {}), lines,
                    log_dir=tmp_path / "logs", stop_timeout_s=2, mounts=mounts, timeout_s=300,
                    **kwargs)
    return code, lines


def test_a_script_exiting_3_ends_the_job_with_3_and_is_not_retried(docker_client, cluster_image,
                                                                   tmp_path):
    code, lines = run(docker_client, cluster_image, tmp_path, EXIT3, attempts=2)
    assert code == 3, lines
    (attempt,) = lines.attempts()  # one attempt: a bug is never run twice
    assert attempt.startswith("attempt 1/2: exit 3 (user on node "), attempt


def never_joins(attempt, index):
    """Node 2 of the first attempt: its container runs, the entrypoint never starts."""
    if attempt == 1 and index == 2:
        return {"entrypoint": ["sleep", "600"]}
    return {}


def test_a_node_that_never_joins_is_retried_once_and_attempt_2_succeeds(docker_client,
                                                                       cluster_image, tmp_path):
    code, lines = run(docker_client, cluster_image, tmp_path, SHOW_ATTEMPT,
                      {"MNP_WAIT_TIMEOUT": "20"}, attempts=2, node_options=never_joins)
    first, second = lines.attempts()
    assert first.startswith(f"attempt 1/2: exit {errors.INFRASTRUCTURE_EXIT} (infrastructure on "
                            "node 2): node(s) 2 never registered within 20s"), first
    assert second.startswith("attempt 2/2: exit 0 (success on node 0)"), second
    assert code == 0
    ranks = [line for line in lines if line.endswith("attempt 2")]
    assert len(ranks) == 3, lines  # MNP_ATTEMPT=2 reached the command on every rank
    assert not [line for line in lines if line.endswith("attempt 1")]


def fake_gpus(counts, shm="9g"):
    """Every node gets /dev/nvidiaN device nodes (``/dev/null`` under that name) and a /dev/shm
    of the size the instance type promises; ``counts`` says how many GPUs per node."""
    def options(attempt, index):
        count = counts.get(index, 4)
        return {"devices": [f"/dev/null:/dev/nvidia{n}:rwm" for n in range(count)],
                "shm_size": shm}
    return options


def test_a_node_with_fewer_gpus_than_its_type_promises_fails_basic(docker_client, cluster_image,
                                                                  tmp_path):
    code, lines = run(docker_client, cluster_image, tmp_path, SHOW_ATTEMPT,
                      {"MNP_INSTANCE_TYPE": "g5.12xlarge", "MNP_FABRIC": "tcp"},
                      node_options=fake_gpus({2: 3}))
    assert code == errors.INFRASTRUCTURE_EXIT, lines
    (attempt,) = lines.attempts()
    assert attempt.startswith("attempt 1/1: exit 200 (infrastructure on node 2): "), attempt
    # the failing node's own line: what it has, where it looked, and the row it compared with
    assert ("node 2 says: exit 200 (infrastructure on node 2): health check failed on node 2: "
            "GPUs: 3 found (/dev/nvidia[0-9]* (3 devices)), fewer than the 4 the instance type "
            "promises (matrix/model/instances.yaml row g5.12xlarge: gpus 4)") in attempt, attempt
    assert not [line for line in lines if line.startswith("attempt 1")
                and "(infrastructure on node 0)" in line]


def throttle(rate, burst="256kb"):
    """A tc token bucket on node 2's interface, from the host, as soon as it started."""
    def on_start(attempt, index, container):
        if index != 2:
            return
        container.reload()
        pid = str(container.attrs["State"]["Pid"])
        subprocess.run(["nsenter", "-t", pid, "-n", "tc", "qdisc", "add", "dev", "eth0", "root",
                        "tbf", "rate", rate, "burst", burst, "latency", "400ms"], check=True)
    return on_start


def test_a_throttled_node_fails_full_with_its_bandwidth_against_the_floor(docker_client,
                                                                        cluster_image, tmp_path):
    code, lines = run(docker_client, cluster_image, tmp_path, SHOW_ATTEMPT,
                      {"MNP_HEALTH": "full"}, on_start=throttle("50mbit"))
    assert code == errors.INFRASTRUCTURE_EXIT, lines
    final = [line for line in lines if line.startswith("mnp-entrypoint[main 0/3]: exit ")][-1]
    match = re.search(r"exit 200 \(infrastructure on node 2\): bandwidth below the floor on "
                      r"node 2: (\d+\.\d+) Gbit/s link bandwidth, floor 0\.20 Gbit/s", final)
    assert match and float(match.group(1)) < 0.2, final
    assert not [line for line in lines if line.endswith("attempt 1")]  # no rank started


def test_an_unthrottled_job_passes_full(docker_client, cluster_image, tmp_path):
    code, lines = run(docker_client, cluster_image, tmp_path, SHOW_ATTEMPT,
                      {"MNP_HEALTH": "full"})
    assert code == 0, lines
    assert [line for line in lines if "bandwidth probe passed" in line], lines


@pytest.mark.slow
def test_invoke_run_attempts_stops_on_a_user_failure(cpu_tcp_image):
    """The same through the command line: `invoke run --nodes 3 --attempts 2`."""
    proc = subprocess.run([sys.executable, "-m", "invoke", "run", "--stack", "cpu-tcp", "--nodes",
                           "3", "--attempts", "2", "--", *EXIT3], cwd=ROOT, capture_output=True,
                          text=True, timeout=600, check=False)
    assert proc.returncode == 3, (proc.stdout[-2000:], proc.stderr[-2000:])
    attempts = [line for line in proc.stdout.splitlines() if line.startswith("attempt ")]
    assert len(attempts) == 1 and attempts[0].startswith("attempt 1/2: exit 3 (user on node ")


PAYLOAD = (b"[main 0/3] kept\n[/fsx/ckpt] saved step 100\n[bold]not bold[/bold]\n"
           b"\x1b[31mred\x1b[0m\n\xff\xfe not UTF-8\n" + b"y" * 300 + b"\n")


@pytest.mark.slow
def test_invoke_run_passes_node_output_through_a_pipe_unchanged(cpu_tcp_image):
    """Issue 31: what the job prints reaches a pipe byte for byte (Rich used to read it as
    markup, and ``[/fsx/ckpt]`` killed the streaming thread), the rehearsal's own lines are one
    line each however long, and its status is the job's. ``--env`` reaches the nodes."""
    import base64
    command = ["sh", "-c", f"echo {base64.b64encode(PAYLOAD).decode()} | base64 -d; "
               'echo "health=$MNP_HEALTH"; exit 3']
    proc = subprocess.run([sys.executable, "-m", "invoke", "run", "--stack", "cpu-tcp", "--nodes",
                           "2", "--env", "MNP_LAUNCHER=none", "--env", "MNP_HEALTH=off", "--",
                           *command], cwd=ROOT, capture_output=True, timeout=600, check=False)
    assert proc.returncode == 3, (proc.stdout[-2000:], proc.stderr[-2000:])
    assert PAYLOAD + b"health=off\n" in proc.stdout, proc.stdout[-3000:]
    (attempt,) = [line for line in proc.stdout.splitlines() if line.startswith(b"attempt ")]
    assert attempt.startswith(b"attempt 1/1: exit 3 (user on node 0 "), attempt  # and its address
    # the rehearsal's own longest line, whole (Rich folded lines at 100 columns in a pipe)
    (first,) = [line for line in proc.stdout.splitlines() if line.startswith(b"rehearsal ")]
    assert len(first) > 100 and re.fullmatch(rb"rehearsal \w+: 2 node\(s\) of \S+ on network "
                                             rb"mnp-rehearsal-\w+ \(attempt 1\)", first), first


def read_until_eof(fd, bound_s=600):
    """Everything written to a pty's master until every writer closed the slave (Linux reads
    EIO then); ``bound_s`` only keeps a hung rehearsal from hanging the suite."""
    import select
    data = b""
    while select.select([fd], [], [], bound_s)[0]:
        try:
            chunk = os.read(fd, 65536)
        except OSError:  # EIO: the slave side is closed
            break
        if not chunk:
            break
        data += chunk
    return data


@pytest.mark.slow
def test_invoke_run_passes_node_output_to_a_terminal_unchanged(cpu_tcp_image):
    """Issue 31, the terminal half: Rich behaves differently when stdout is a TTY (it reads
    markup, folds at the terminal's width, styles), so ``invoke run`` runs with stdin, stdout
    and stderr on a pseudo-terminal 40 columns wide. The slave is raw (``tty.setraw``: no
    "\n" -> "\r\n"), so what arrives on the master is what ``invoke run`` wrote: the node's
    bytes unchanged, the rehearsal's own lines whole, and the job's status as its own."""
    import base64
    import fcntl
    import struct
    import termios
    import tty
    command = ["sh", "-c", f"echo {base64.b64encode(PAYLOAD).decode()} | base64 -d; exit 3"]
    master, slave = os.openpty()
    try:
        tty.setraw(slave)
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 40, 0, 0))
        env = {key: value for key, value in os.environ.items() if key != "COLUMNS"}
        proc = subprocess.Popen([sys.executable, "-m", "invoke", "run", "--stack", "cpu-tcp",
                                 "--nodes", "2", "--env", "MNP_LAUNCHER=none", "--env",
                                 "MNP_HEALTH=off", "--", *command], cwd=ROOT, env=env,
                                stdin=slave, stdout=slave, stderr=slave, start_new_session=True)
        os.close(slave)
        slave = None
        received = read_until_eof(master)
        status = proc.wait(timeout=60)
    finally:
        os.close(master)
        if slave is not None:
            os.close(slave)
    assert status == 3, received[-3000:]  # the job's status (the main node's), as documented
    assert PAYLOAD in received, received[-3000:]
    lines = received.split(b"\n")
    (attempt,) = [line for line in lines if line.startswith(b"attempt ")]
    assert attempt.startswith(b"attempt 1/1: exit 3 (user on node 0 "), attempt  # and its address
    # the rehearsal's own lines whole, wider than the terminal, with no style added
    (first,) = [line for line in lines if line.startswith(b"rehearsal ")]
    assert re.fullmatch(rb"rehearsal \w+: 2 node\(s\) of \S+ on network "
                        rb"mnp-rehearsal-\w+ \(attempt 1\)", first), first


@pytest.mark.slow
@pytest.mark.parametrize("rate", ["2mbit", "20mbit"])
def test_a_very_slow_node_is_named_within_the_probes_bound(docker_client, cluster_image,
                                                           tmp_path, rate):
    """Issue 31: at 2 Mbit/s gloo's own 60 s transport timeout used to end the probe before any
    figure was collected, and the gate blamed the main node it ran on. Each link now has its
    own deadline: the throttled node is named, with its figure as a bound, within the probe's
    bound (``health.FULL_BUDGET_S``), and no rank starts."""
    from entrypoint.probe import health
    code, lines = run(docker_client, cluster_image, tmp_path, SHOW_ATTEMPT,
                      {"MNP_HEALTH": "full"}, on_start=throttle(rate))
    assert code == errors.INFRASTRUCTURE_EXIT, lines
    final = [line for line in lines if line.startswith("mnp-entrypoint[main 0/3]: exit ")][-1]
    assert "exit 200 (infrastructure on node 2): bandwidth below the floor on node 2: " in final
    failed = [line for line in lines if "health check failed after" in line]
    took = float(re.search(r"failed after (\d+\.\d)s", failed[0]).group(1))
    assert took <= health.FULL_BUDGET_S + 10, failed
    assert not [line for line in lines if line.endswith("attempt 1")]  # no rank started
    node2 = (tmp_path / "logs" / "node2.log").read_text(errors="replace").splitlines()
    assert "exit 0" not in node2[-1] and "(infrastructure on node 2)" in node2[-1], node2[-3:]

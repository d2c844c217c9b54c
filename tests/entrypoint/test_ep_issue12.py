"""Issue 12 (everything but the rendezvous, which test_ep_hostile*.py cover): MPI parameters
merged once, the job's environment for every rank, and the Low items. Each test names the
defect it pins; the process tests run the real entrypoint as a process."""

import ast
import functools
import os
import signal
import socket
import time
from pathlib import Path

import pytest

from entrypoint.launchers import mca
from entrypoint.plan import make as plan
from entrypoint.probe.facts import NodeFacts
from entrypoint.rendezvous.server import NodeInfo
from entrypoint.settings import config

ROOT = Path(__file__).resolve().parents[2]
MAIN = {"AWS_BATCH_JOB_NODE_INDEX": "0", "AWS_BATCH_JOB_MAIN_NODE_INDEX": "0",
        "AWS_BATCH_JOB_NUM_NODES": "3", "MNP_SECRET": "s"}
BINARIES = {"mpirun": "/usr/bin/mpirun", "sshd": "/usr/sbin/sshd", "python3": "/usr/bin/python3",
            "deepspeed": "/usr/local/bin/deepspeed", "pdsh": "/usr/bin/pdsh"}
HOSTFILES = {"openmpi": "/run/mnp/hostfile", "plain": "/run/mnp/hostfile.plain",
             "intel": "/run/mnp/hostfile.intel"}


def node(**kw):
    values = dict(address="10.0.0.5", interface="eth0", address_reason="test", is_root=True,
                  binaries=dict(BINARIES), home="/root", versions={"deepspeed": "0.14.4"})
    values.update(kw)
    return NodeFacts(**values)


def make(facts=None, user_env=None, table=None, **settings):
    env = dict(MAIN)
    env.update(settings)
    return plan.make_plan(config.load(env), facts or node(), ["python3", "train.py"],
                          user_env if user_env is not None else {"PATH": "/bin"}, table,
                          HOSTFILES)


def mca_on_command_line(argv):
    return [a for a in argv if a in ("-mca", "--mca")]


# -- High 2 / Medium 3: one merged set of MPI parameters ------------------------------------------

def test_mpirun_parameters_are_variables_and_the_users_mca_wins():
    p = make(MNP_LAUNCHER_ARGS="--mca btl tcp,self --mca pml ucx -x FOO")
    assert mca_on_command_line(p.argv) == []
    assert p.environment["OMPI_MCA_btl"] == "tcp,self"
    assert p.environment["OMPI_MCA_pml"] == "ucx"
    assert p.environment["OMPI_MCA_btl_tcp_if_include"] == "eth0"
    assert p.argv[-4:] == ["-x", "FOO", "python3", "train.py"]
    assert any("btl=tcp,self from MNP_LAUNCHER_ARGS (ours: ^openib)" in k for k in p.kept)
    assert ["btl", "tcp,self", "MNP_LAUNCHER_ARGS"] in p.mca


def test_users_ompi_mca_variable_wins_and_stays_theirs():
    p = make(user_env={"PATH": "/bin", "OMPI_MCA_pml": "cm"})
    assert p.environment["OMPI_MCA_pml"] == "cm"
    assert ["pml", "cm", "OMPI_MCA_pml"] in p.mca


def test_malformed_mca_is_a_problem_line():
    assert make(MNP_LAUNCHER_ARGS="--mca btl").problems == [
        "MNP_LAUNCHER_ARGS: --mca needs a name and a value"]


def test_deepspeed_openmpi_runner_gets_no_mca_on_its_command_line():
    """DeepSpeed 0.12.6-0.14.5 put --mca btl ^openib --mca btl_tcp_if_include eth0 on their own
    mpirun line; the old plan added ours in --launcher_args: Open MPI stopped (listed twice)."""
    p = make(MNP_LAUNCHER="deepspeed", MNP_DEEPSPEED_LAUNCHER="openmpi")
    launcher_args = [a for a in p.argv if a.startswith("--launcher_args")]
    assert launcher_args == ["--launcher_args=--allow-run-as-root"]
    assert p.environment["OMPI_MCA_plm_rsh_no_tree_spawn"] == "1"
    assert p.environment["OMPI_MCA_orte_default_hostfile"] == "/run/mnp/hostfile"
    assert p.problems == []


def test_deepspeed_openmpi_runner_names_a_user_value_it_would_override():
    p = make(MNP_LAUNCHER="deepspeed", MNP_DEEPSPEED_LAUNCHER="openmpi",
             MNP_LAUNCHER_ARGS="--mca btl tcp,self")
    assert len(p.problems) == 1 and "MNP_DEEPSPEED_LAUNCHER=pdsh" in p.problems[0]
    other_if = make(node(interface="ens5"), MNP_LAUNCHER="deepspeed",
                    MNP_DEEPSPEED_LAUNCHER="openmpi")
    assert other_if.problems == [] and any("btl_tcp_if_include eth0" in n for n in other_if.notes)


def test_mca_merge_order():
    merged = mca.merge([("btl", "^openib"), ("pml", "ob1")], {"OMPI_MCA_btl": "self"},
                       [("btl", "tcp,self")])
    assert [p.to_list() for p in merged] == [["btl", "tcp,self", "MNP_LAUNCHER_ARGS"],
                                             ["pml", "ob1", "ours"]]
    assert merged[0].replaced == "self"


# -- Medium 4: the job's environment on every rank ------------------------------------------------

JOB_ENV = {"PATH": "/bin", "MY_SETTING": "42", "AWS_REGION": "eu-west-1",
           "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI": "/v2/credentials/abc", "HOSTNAME": "ip-1",
           "AWS_BATCH_JOB_NODE_INDEX": "0", "ECS_CONTAINER_METADATA_URI_V4": "http://x/v4"}


def test_mpirun_forwards_the_job_environment():
    argv = make(user_env=dict(JOB_ENV)).argv
    exported = [argv[i + 1] for i, a in enumerate(argv) if a == "-x"]
    for name in ("MY_SETTING", "AWS_REGION", "PATH"):
        assert name in exported
    for name in ("HOSTNAME", "AWS_BATCH_JOB_NODE_INDEX", "ECS_CONTAINER_METADATA_URI_V4",
                 "MNP_NODE_INDEX", "OMPI_MCA_btl", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI"):
        assert name not in exported


@pytest.mark.parametrize("runner", ["pdsh", "openmpi"])
def test_deepspeed_env_file_carries_the_job_environment(runner):
    env = dict(JOB_ENV, JSONISH='{"a": 1}')
    p = make(user_env=env, MNP_LAUNCHER="deepspeed", MNP_DEEPSPEED_LAUNCHER=runner)
    content = p.files[0]["content"]
    assert "MY_SETTING=42\n" in content and "AWS_REGION=eu-west-1\n" in content
    assert "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI" not in content  # each node's sshd's
    assert "HOSTNAME=" not in content and "JSONISH" not in content
    assert any("JSONISH" in n for n in p.notes)


def test_each_nodes_sshd_gives_ranks_that_nodes_own_credentials_id(tmp_path):
    """ECS issues the task role's credentials id per task (every MNP node is one): ranks that
    SSH starts on a node get that node's value from its sshd, via the job key's options."""
    from entrypoint.run import ssh
    paths = ssh.Paths(str(tmp_path))
    paths.make()
    ssh.authorize(paths, "ssh-ed25519 AAAAC3Nz", {
        "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI": "/v2/credentials/node-2",
        "ECS_CONTAINER_METADATA_URI_V4": 'bad"quote', "AWS_REGION": "eu-west-1"})
    line = Path(paths.authorized_keys).read_text()
    assert line == ('environment="AWS_CONTAINER_CREDENTIALS_RELATIVE_URI=/v2/credentials/node-2" '
                    "ssh-ed25519 AAAAC3Nz\n")
    assert "PermitUserEnvironment yes" in ssh.sshd_config_text(paths, 2222, "root")


# -- Low: redaction by name pattern and by value shape --------------------------------------------

@pytest.mark.parametrize("name,value", [
    ("DATABASE_URL", "postgres://db/x"), ("GITHUB_PAT", "x"), ("OPENAI_APIKEY", "x"),
    ("SERVICE_AUTH", "x"), ("SENTRY_DSN", "https://k@sentry.io/1"), ("AWS_ACCESS_KEY_ID", "x"),
    ("AWS_SECRET_ACCESS_KEY", "x"), ("AWS_SESSION_TOKEN", "x"), ("SLACK_WEBHOOK", "x"),
    ("NOTIFY", "https://hooks.slack.com/services/T000/B000/XXXX"),
    ("MIRROR", "https://user:hunter2@example.com/simple"),
    ("SOME_ID", "AKIAABCDEFGHIJKLMNOP"), ("TOOL", "ghp_" + "a" * 36),
    ("CALLBACK", "https://example.com/cb?token=abc"),
    ("DEPLOY", "-----BEGIN OPENSSH PRIVATE" + " KEY-----\\nb3Blbn"),
])
def test_likely_secrets_are_redacted(name, value):
    assert plan.redact(name, value) == "<redacted>"


@pytest.mark.parametrize("name,value", [("PATH", "/usr/bin"), ("HF_HOME", "/h"),
                                        ("MNP_HOSTFILE", "/run/mnp/hostfile"),
                                        ("PIP_INDEX_URL", "https://pypi.org/simple")])
def test_ordinary_values_are_shown(name, value):
    assert plan.redact(name, value) == value


def test_dry_run_text_redacts_by_value_shape():
    text = make(user_env={"PATH": "/bin", "MIRROR": "https://u:pw@example.com/x"}).text()
    assert "pw@" not in text and "MIRROR=<redacted>" in text


# -- Low: two nodes with one address; /dev/shm and memlock ----------------------------------------

def test_two_nodes_with_one_address_is_a_problem():
    table = [NodeInfo(0, "10.0.0.5", 1, ""), NodeInfo(1, "10.0.0.6", 1, ""),
             NodeInfo(2, "10.0.0.6", 1, "")]
    p = make(table=table)
    assert p.problems == ["nodes 1 and 2 both have the address 10.0.0.6: each node needs its own "
                          "(awsvpc networking gives every container one)"]
    torch_node = node(versions={"pytorch": "2.3.1"})  # torchrun needs PyTorch on the node
    assert make(torch_node, table=table, MNP_LAUNCHER="torchrun").problems == []


def test_small_shm_and_memlock_on_a_gpu_node_are_named():
    facts = node(gpus=8, slots=8, shm_bytes=64 << 20, memlock=64 << 10)
    notes = " ".join(make(facts).notes)
    assert "/dev/shm is 64 MiB" in notes and "sharedMemorySize" in notes
    assert "memlock limit is 64 KiB" in notes and "memlock, softLimit: -1" in notes
    fine = make(node(gpus=8, slots=8, shm_bytes=16 << 30, memlock=-1)).notes
    assert not [n for n in fine if "shm" in n or "memlock" in n]
    cpu = make(node(shm_bytes=64 << 20, memlock=64 << 10)).notes
    assert not [n for n in cpu if "shm" in n or "memlock" in n]


# -- Low: bounds and bad values: one line, exit 2, no hang ----------------------------------------

@pytest.fixture
def run(local_node):
    """The entrypoint run to its end on this host, its output as bytes (some tests feed it bytes
    that are not UTF-8)."""
    return functools.partial(local_node.run, timeout=20, text=False)


def one_error_line(result, variable):
    stderr = result.stderr.decode("utf-8", "replace")
    assert result.returncode == 2, stderr
    assert "Traceback" not in stderr
    errors = [line for line in stderr.splitlines() if "error" in line]
    assert len(errors) == 1 and variable in errors[0], stderr
    return errors[0]


def test_a_huge_node_count_is_refused_at_once(run):
    start = time.monotonic()
    result = run(["true"], MNP_DRY_RUN="1", AWS_BATCH_JOB_NUM_NODES="10000000",
                 AWS_BATCH_JOB_NODE_INDEX="0", AWS_BATCH_JOB_MAIN_NODE_INDEX="0")
    assert "above the maximum" in one_error_line(result, "AWS_BATCH_JOB_NUM_NODES")
    assert time.monotonic() - start < 10


@pytest.mark.parametrize("name,value", [
    ("MNP_HEARTBEAT_TIMEOUT", "0.05"), ("MNP_WAIT_TIMEOUT", "1e12"), ("MNP_NP", "10" * 10),
    ("MNP_STATE_DIR", "/tmp/with space"), ("MNP_STATE_DIR", "/tmp/100%"),
])
def test_numbers_and_paths_out_of_bounds(run, name, value):
    one_error_line(run(["true"], **{name: value}), name)


def test_secret_file_fifo_devzero_and_newline_name(run, tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(str(fifo))
    for path in (str(fifo), "/dev/zero", str(tmp_path / "a\nb")):
        start = time.monotonic()
        one_error_line(run(["true"], MNP_SECRET_FILE=path), "MNP_SECRET_FILE")
        assert time.monotonic() - start < 10
    big = tmp_path / "big"
    big.write_bytes(b"x" * (1 << 20))
    one_error_line(run(["true"], MNP_SECRET_FILE=str(big)), "MNP_SECRET_FILE")


@pytest.fixture
def bytes_env(local_node):
    """A clean environment for the entrypoint, names and values as bytes."""

    def make(**extra):
        env = {k.encode(): v.encode() for k, v in local_node.env().items()}
        env.update(extra)
        return env

    return make


def test_secret_with_bytes_that_are_not_utf8_is_one_line(run, bytes_env):
    one_error_line(run(["true"], env=bytes_env(**{"MNP_SECRET": b"\xff\xfe"})), "MNP_SECRET")


@pytest.mark.parametrize("encoding", ["ascii", "utf-8"])
def test_dry_run_survives_environment_bytes_that_are_not_utf8(run, bytes_env, encoding):
    """Python 3.6 in the C locale writes stdout as strict ASCII; PYTHONIOENCODING reproduces
    that on any Python: the old dry run died with UnicodeEncodeError."""
    env = bytes_env(MNP_DRY_RUN=b"1", PYTHONIOENCODING=encoding.encode(),
                    WEIRD=b"caf\xe9\xff", **{"WEIRD_\xff": b"x"})
    result = run(["true"], env=env)
    assert result.returncode == 0, result.stderr
    assert b"Traceback" not in result.stderr
    assert b"WEIRD=caf\\udce9\\udcff" in result.stdout


# -- Low: the secret leaves PID 1's environment; signals during probing --------------------------

FAKE_NVIDIA_SMI = """#!/bin/sh
env > "$PROBE_OUT/env"
: > "$PROBE_OUT/started"
sleep "${PROBE_SLEEP:-0}"
exit 1
"""


@pytest.fixture
def fake_probe(local_node):
    return local_node.fake_program("nvidia-smi", FAKE_NVIDIA_SMI)


def test_probe_tools_never_see_the_secret(run, tmp_path, fake_probe):
    result = run(["sh", "-c", f"env > {tmp_path}/cmd_env"], MNP_SECRET="topsecret-123",
                 PROBE_OUT=str(tmp_path), PATH=f"{fake_probe}:{os.environ['PATH']}")
    assert result.returncode == 0, result.stderr
    assert "PROBE_OUT" in (tmp_path / "env").read_text()  # the fake tool did run
    assert "topsecret-123" not in (tmp_path / "env").read_text()
    assert "topsecret-123" not in (tmp_path / "cmd_env").read_text()


def test_main_drops_the_secret_from_its_own_environment(monkeypatch):
    from entrypoint.run import main as main_mod
    monkeypatch.setenv("MNP_SECRET", "x")
    monkeypatch.setenv("MNP_DRY_RUN", "json")
    for name in [n for n in os.environ if n.startswith("AWS_BATCH_")]:
        monkeypatch.delenv(name)
    assert main_mod.main(["true"]) == 0
    assert "MNP_SECRET" not in os.environ


def test_sigterm_while_probing_ends_the_run_with_143(local_node, tmp_path, fake_probe):
    marker = tmp_path / "job-ran"
    proc = local_node.start(["touch", str(marker)], text=False, PROBE_OUT=str(tmp_path),
                            PROBE_SLEEP="30", PATH=f"{fake_probe}:{os.environ['PATH']}")
    deadline = time.monotonic() + 20
    while not (tmp_path / "started").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert (tmp_path / "started").exists()
    start = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=15)
    assert proc.returncode == 143, out
    assert time.monotonic() - start < 5
    assert not marker.exists()


def test_child_stops_promptly_when_the_main_node_accepts_and_stays_silent(local_node, tmp_path):
    address = local_node.address()
    # a torchrun program on PATH: without PyTorch the plan stops the child before it connects
    bindir = local_node.fake_program("torchrun", "#!/bin/sh\nexit 0\n")
    silent = socket.socket()
    silent.bind(("0.0.0.0", 0))
    silent.listen(5)
    try:
        proc = local_node.start(
            ["true"], text=False,
            AWS_BATCH_JOB_NODE_INDEX="1", AWS_BATCH_JOB_MAIN_NODE_INDEX="0",
            AWS_BATCH_JOB_NUM_NODES="2", MNP_LAUNCHER="torchrun",
            PATH=f"{bindir}:{os.environ.get('PATH', '/usr/bin:/bin')}",
            AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS=address,
            MNP_RENDEZVOUS_PORT=str(silent.getsockname()[1]),
            MNP_STATE_DIR=str(tmp_path / "state"))
        conn, _ = silent.accept()  # accepted; never a byte back
        time.sleep(0.5)
        start = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=20)
        assert proc.returncode == 143, out
        assert time.monotonic() - start < 8, "the old child waited ~13 s for the hello"
        conn.close()
    finally:
        silent.close()


# -- Low: a monotonic clock for every timeout -----------------------------------------------------

def test_no_wall_clock_timeouts_in_the_entrypoint():
    """``time.time()`` only where an epoch deadline from a caller is converted once, and in
    run/attribution.py, whose failure times order failures across nodes (a monotonic clock
    counts from each host's own start, so only the wall clock compares between nodes); no
    timeout anywhere reads the wall clock."""
    calls = []
    for path in sorted((ROOT / "entrypoint").rglob("*.py")):
        for item in ast.walk(ast.parse(path.read_text())):
            if isinstance(item, ast.Call) and isinstance(item.func, ast.Attribute) and \
                    item.func.attr == "time" and getattr(item.func.value, "id", "") == "time":
                calls.append(f"{path.name}:{item.lineno}")
    deadlines = [call for call in calls if not call.startswith("attribution.py")]
    assert len(deadlines) == 1 and deadlines[0].startswith("server.py"), calls

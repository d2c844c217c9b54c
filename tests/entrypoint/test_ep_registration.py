"""Issue 31: registration is a state machine, and a child that failed its start-up checks is never
counted ready: the main node starts no launcher and no user command.

In process, in a driven order: a real rendezvous ``Server`` on this host, children that go
through the entrypoint's own child path (``BatchNodes.register`` / ``report_failed_child``), and
the main node's own ``main_after_start``, each ``BatchNodes`` given a ``NodeHost`` that records
what would be started instead of starting it. Each step waits on a state the server reaches
(a node's registration state), never on the clock.
"""

import re
import threading
import time
from types import SimpleNamespace

import pytest

from entrypoint.core import errors
from entrypoint.rendezvous import server as rendezvous
from entrypoint.rendezvous import states
from entrypoint.rendezvous.states import NodeState
from entrypoint.run import host as host_interface
from entrypoint.run import lifecycle, outcome
from entrypoint.run.batchnodes import BatchNodes
from entrypoint.settings import config

TRIES = 20


class RecordingHost(host_interface.NodeHost):
    """A node with a real configuration (``config.load``) that records what it is asked to
    start: the launcher (which would start the user's command) above all."""

    def __init__(self, env, address, tmp_path):
        self.cfg = config.load(env)
        self.sup = lifecycle.Supervisor()
        self.paths = None
        self.environ = dict(env)
        self.facts = SimpleNamespace(address=address)
        self.plan = SimpleNamespace(health=None)
        self.command = ["python3", "train.py"]
        self.node = self.cfg.node_index
        self.need_ssh = False
        self.local_launcher = False
        self.slot_count = 1
        self.user = "root"
        self.started = []
        self.tmp_path = tmp_path

    def hb(self):
        return 0.5, 10.0

    def make_plan(self, table, hostfiles):
        return SimpleNamespace(table=table, problems=[])

    def prepare(self, plan):
        pass

    def make_state_dir(self):
        pass

    def start_sshd(self):
        raise AssertionError("no SSH in this job")

    def alive(self, proc):
        return True

    def start_launcher(self, plan):
        self.started.append(("launcher", plan))

    def own_outcome(self, code):
        return outcome.of_command(code, self.node)

    def run_launcher(self, plan, watch=None):
        self.started.append(("launcher", plan))
        return outcome.success(self.node)


def batch_env(index, port, main_address, tmp_path, wait="30"):
    env = {"AWS_BATCH_JOB_NODE_INDEX": str(index), "AWS_BATCH_JOB_MAIN_NODE_INDEX": "0",
           "AWS_BATCH_JOB_NUM_NODES": "3", "AWS_BATCH_JOB_ID": f"job-31#{index}",
           "MNP_SECRET": "s31", "MNP_LAUNCHER": "none", "MNP_RENDEZVOUS_PORT": str(port),
           "MNP_WAIT_TIMEOUT": wait, "MNP_STATE_DIR": str(tmp_path / f"state{index}")}
    if index:
        env["AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS"] = main_address
    return env


def wait_state(server, index, wanted):
    """Until node ``index``'s connection is in one of the states ``wanted`` (the server's
    own bookkeeping; the server thread changes it, this thread reads it)."""
    deadline = time.monotonic() + 20  # a bound for a hung test, not a synchronisation
    while time.monotonic() < deadline:
        conn = server.nodes.by_index.get(index)
        if conn is not None and conn.state in wanted:
            return conn
        server.wait(0.01)
    raise AssertionError(f"node {index} never reached {wanted}")


@pytest.fixture
def job(local_node, tmp_path):
    """A started server for a 3-node job, a healthy child 1 (registered and ready) and the
    hosts; the failing child 2 is the test's to drive."""
    address = local_node.address()
    made = []

    def make():
        port = local_node.free_port()
        main = RecordingHost(batch_env(0, port, address, tmp_path), address, tmp_path)
        server = rendezvous.Server(b"s31", main.cfg.job_id, 3, 0, {"client_key": ""}, port,
                                   need_host_key=False, hb_interval=0.5, hb_timeout=10.0)
        server.start()
        made.append(server)
        hosts = [main] + [RecordingHost(batch_env(i, port, address, tmp_path), address,
                                        tmp_path) for i in (1, 2)]
        healthy = BatchNodes(hosts[1]).register("")
        assert not isinstance(healthy, outcome.Outcome), healthy
        made.append(healthy)
        wait_state(server, 1, (NodeState.READY,))
        return server, hosts

    yield make
    for thing in made:
        (thing.stop if hasattr(thing, "stop") else thing.close)()


def fail_child(host):
    """Node 2's own path after failing ``basic``: register, report; in a thread (it waits for
    ``done`` afterwards)."""
    failed = outcome.infrastructure(2, "health check failed on node 2: /dev/shm MiB 64 < 64000")
    thread = threading.Thread(target=BatchNodes(host).report_failed_child, args=(failed,))
    thread.daemon = True
    thread.start()
    return thread


def test_a_failed_child_that_registers_last_is_never_counted_ready(job):
    """The node's last messages are processed before the main node decides: ``go`` is refused
    and node 2 is missing, in every try (before the fix it said ``ready`` and then ``exit``,
    and ``go`` checked only who was missing)."""
    for _ in range(TRIES):
        server, hosts = job()
        fail_child(hosts[2])
        conn = wait_state(server, 2, (NodeState.FAILED, NodeState.EXITED))
        assert conn.state is NodeState.FAILED
        assert server.missing() == [2] and server.nodes.failed == {2: errors.INFRASTRUCTURE_EXIT}
        assert server.go(lambda table: {"nodes": []}, None) is None
        server.stop()


def test_the_main_node_starts_nothing_when_the_last_child_failed(job):
    """The main node's own flow, from the wait to the launcher: it ends the job as
    infrastructure naming node 2, and no launcher (so no user command) starts anywhere."""
    for _ in range(TRIES):
        server, hosts = job()
        fail_child(hosts[2])
        wait_state(server, 2, (NodeState.FAILED, NodeState.EXITED))
        main_info = rendezvous.NodeInfo(0, hosts[0].facts.address, 1, "")
        ended = BatchNodes(hosts[0]).main_after_start(server, main_info, None)
        assert (ended.code, ended.node) == (errors.INFRASTRUCTURE_EXIT, 2), ended.line()
        assert [h.started for h in hosts] == [[], [], []]
        server.done(ended.code, linger=0)
        server.stop()


def test_ready_after_failing_is_an_illegal_transition():
    conn = SimpleNamespace(state=NodeState.REGISTERED)
    states.advance(conn, NodeState.FAILED)
    with pytest.raises(states.IllegalTransition):
        states.advance(conn, NodeState.READY)
    assert conn.state is NodeState.FAILED
    states.advance(conn, NodeState.CLOSED)
    states.advance(conn, NodeState.CLOSED)  # closing twice is harmless


def test_the_runner_implements_the_declared_host_interface():
    from entrypoint.run.main import Runner
    runner = Runner(config.load({}), ["true"])  # its constructor checks it, too
    assert host_interface.missing_names(runner) == []
    with pytest.raises(TypeError, match="NodeHost"):
        BatchNodes(object())


def test_a_server_bug_is_the_main_nodes_internal_failure_not_a_rejection(local_node, tmp_path,
                                                                       monkeypatch, capfd):
    """Break the server once while it serves a legitimate child: the main node ends the job as
    infrastructure on node 0 with the traceback in its log; the child is not told it was
    rejected (that was exit 2, configuration, never retried)."""
    from entrypoint.rendezvous import registry

    def broken_add(self, conn, info):
        raise RuntimeError("bug 31 in the registry")

    monkeypatch.setattr(registry.Registry, "add", broken_add)
    address = local_node.address()
    port = local_node.free_port()
    main = RecordingHost(batch_env(0, port, address, tmp_path), address, tmp_path)
    child = RecordingHost(batch_env(1, port, address, tmp_path, wait="3"), address, tmp_path)
    ended = {}
    thread = threading.Thread(target=lambda: ended.setdefault("main", BatchNodes(main).run_main()))
    thread.start()
    got = BatchNodes(child).register("")
    thread.join(60)
    assert isinstance(got, outcome.Outcome) and got.code == errors.INFRASTRUCTURE_EXIT, got
    assert "rejected" not in got.reason
    final = ended["main"]
    assert (final.code, final.node) == (errors.INFRASTRUCTURE_EXIT, 0), final.line()
    assert re.search(r"internal error of the rendezvous server while serving \S+ \(node 1\)",
                     final.reason), final.reason
    assert "bug 31 in the registry" in final.reason
    log = capfd.readouterr().err
    assert "Traceback (most recent call last):" in log and "in broken_add" in log, log
    assert [h.started for h in (main, child)] == [[], []]


def test_a_batch_child_without_a_network_is_infrastructure(local_node):
    """Issue 31: a child whose network cannot reach its main node (a namespace with no
    interface up: ``Network is unreachable``) is a host fault, retried elsewhere: 200, not 2."""
    import shutil
    import subprocess
    import sys

    if shutil.which("unshare") is None or subprocess.run(["unshare", "-n", "true"]).returncode:
        pytest.skip("cannot make a network namespace here (unshare -n)")
    env = local_node.env(AWS_BATCH_JOB_NODE_INDEX="1", AWS_BATCH_JOB_MAIN_NODE_INDEX="0",
                         AWS_BATCH_JOB_NUM_NODES="2", MNP_LAUNCHER="torchrun",
                         AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS="10.0.0.9")
    proc = subprocess.run(["unshare", "-n", sys.executable, "-m", "entrypoint", "true"], env=env,
                          capture_output=True, text=True, timeout=60)
    last = proc.stderr.splitlines()[-1]
    assert proc.returncode == errors.INFRASTRUCTURE_EXIT, proc.stderr
    assert "(infrastructure on node 1)" in last and "Network is unreachable" in last, last


def test_efa_without_devices_is_a_problem_in_the_dry_run(local_node):
    result = local_node.run(["python3", "train.py"], MNP_FABRIC="efa", MNP_DRY_RUN="1")
    assert result.returncode == 1, result.stderr
    assert "PROBLEM (a real run stops here): MNP_FABRIC=efa but no /dev/infiniband/uverbs* " \
           "device is visible" in result.stdout


def test_one_node_without_efa_devices_is_that_hosts_fault():
    from entrypoint.run import gate
    one = gate.efa_verdict(3, {2})
    assert (one.code, one.node) == (errors.INFRASTRUCTURE_EXIT, "2")
    every = gate.efa_verdict(3, {0, 1, 2})
    assert (every.code, every.node) == (errors.CONFIGURATION_EXIT, "0,1,2")


def probe_runner(node=0):
    """What ``gate.full`` reads of a node: its plan's health record and index."""
    from entrypoint.probe import health
    record = {"mode": "full", "bandwidth": health.bandwidth_plan("tcp", "none", None)}
    return SimpleNamespace(plan=SimpleNamespace(health=record, environment={}), node=node,
                           cfg=None, facts=None, sup=None)


def test_another_nodes_silence_names_that_node_not_this_one(monkeypatch):
    """Issue 31: the probe reports the nodes whose figures never came; the gate names them,
    never the node it runs on (it used to say 'infrastructure on node 0')."""
    from entrypoint.run import gate
    result = {"nodes": [{"node": 0, "in_fwd": 1.0, "in_rev": 1.0}], "missing": [2],
              "link_s": 20.0, "busbw": None}
    monkeypatch.setattr(gate, "probe_argv", lambda runner, table: ["probe"])
    monkeypatch.setattr(gate, "run_probe", lambda *args: (result, None))
    ended = gate.full(probe_runner(0), [1, 2, 3])
    assert (ended.code, ended.node) == (errors.INFRASTRUCTURE_EXIT, "2"), ended.line()
    assert "node(s) 2 sent no bandwidth figures" in ended.reason


def test_a_link_that_did_not_finish_names_its_sender_with_the_bound(monkeypatch):
    from entrypoint.run import gate
    slow = 32 * 8 / 20.0 / 1000  # 32 MiB (about) not arrived in 20 s: an upper bound
    result = {"nodes": [{"node": 0, "in_fwd": slow, "in_rev": 0.9, "bound_fwd": True},
                        {"node": 1, "in_fwd": 0.9, "in_rev": slow, "bound_rev": True},
                        {"node": 2, "in_fwd": 0.9, "in_rev": 0.9}],
              "missing": [], "link_s": 20.0, "busbw": None}
    assert gate.bounded_senders(result["nodes"]) == {2}
    monkeypatch.setattr(gate, "probe_argv", lambda runner, table: ["probe"])
    monkeypatch.setattr(gate, "run_probe", lambda *args: (result, None))
    ended = gate.full(probe_runner(0), [1, 2, 3])
    assert (ended.code, ended.node) == (errors.INFRASTRUCTURE_EXIT, 2), ended.line()
    assert "MiB did not arrive within 20.0s" in ended.reason

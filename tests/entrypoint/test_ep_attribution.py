"""Issue 43: the failure a launcher's output names, read into the final line (``run.attribution``).

The inputs are what Open MPI 4.1.4, torch 1.13's torchrun and DeepSpeed 0.14.4's pdsh runner print
in the cpu-tcp rehearsals (tests/integration/test_attribution_rehearsed.py runs them for real);
here each shape is read once, fast, with the cases a rehearsal does not reach (a signal, a
chained exception, a traceback printed and handled long before, an overlong line).
"""

import json
import re
from types import SimpleNamespace

import pytest

from entrypoint.core import errors
from entrypoint.core.nodes import NodeInfo
from entrypoint.rendezvous import protocol
from entrypoint.rendezvous.registry import Registry
from entrypoint.rendezvous.states import NodeState
from entrypoint.run import attribution, outcome
from entrypoint.run.attribution import Failure, JobShape, Scan, conclude

TABLE = [NodeInfo(0, "10.0.0.5", 2, ""), NodeInfo(1, "10.0.0.7", 2, ""),
         NodeInfo(2, "10.0.0.6", 2, "")]
SHAPE = JobShape(TABLE, 0, True, ("node0",))

MPIRUN_NON_ZERO = b"""\
Traceback (most recent call last):
  File "/opt/boom.py", line 8, in <module>
    raise ValueError("boom-rank-3")
ValueError: boom-rank-3
--------------------------------------------------------------------------
Primary job  terminated normally, but 1 process returned
a non-zero exit code. Per user-direction, the job has been aborted.
--------------------------------------------------------------------------
--------------------------------------------------------------------------
mpirun detected that one or more processes exited with non-zero status, thus causing
the job to be terminated. The first process to do so was:

  Process name: [[23846,1],3]
  Exit code:    1
--------------------------------------------------------------------------
"""


def scanned(data, pdsh=False, chunk=7, at=100.0):
    """``data`` fed the way a pipe delivers it: in small pieces that cut lines anywhere."""
    scan = Scan(pdsh=pdsh)
    for start in range(0, len(data), chunk):
        scan.feed("stderr", data[start:start + chunk], at + start / 1000.0)
    return scan


def test_open_mpi_names_the_rank_and_the_hostfile_its_node():
    failure = conclude(scanned(MPIRUN_NON_ZERO), 1, SHAPE)
    assert (failure.rank, failure.local_rank, failure.node, failure.code) == (3, 1, 1, 1)
    assert failure.error == "ValueError: boom-rank-3" and failure.address == "10.0.0.7"
    ended = outcome.of_failure(failure, 0, "10.0.0.5")
    assert ended.line() == "exit 1 (user on node 1 10.0.0.7, rank 3): ValueError: boom-rank-3"


def test_tagged_lines_give_the_rank_its_own_traceback():
    data = (b"[1,0]<stderr>:Traceback (most recent call last):\n"
            b"[1,0]<stderr>:  File \"x.py\", line 1, in <module>\n"
            b"[1,0]<stderr>:KeyError: 'late'\n"
            b"[1,5]<stderr>:Traceback (most recent call last):\n"
            b"[1,5]<stderr>:  File \"x.py\", line 2, in <module>\n"
            b"[1,5]<stderr>:ZeroDivisionError: division by zero\n"
            b"the job to be terminated. The first process to do so was:\n\n"
            b"  Process name: [[23846,1],5]\n  Exit code:    1\n")
    failure = conclude(scanned(data), 1, SHAPE)
    assert (failure.rank, failure.node, failure.local_rank) == (5, 2, 1)
    assert failure.error == "ZeroDivisionError: division by zero"


def test_a_rank_killed_by_a_signal_is_named_on_the_host_open_mpi_gives():
    data = (b"mpirun noticed that process rank 2 with PID 0 on node 10.0.0.7 exited on signal 9 "
            b"(Killed).\n")
    failure = conclude(scanned(data), 137, SHAPE)
    assert (failure.rank, failure.node, failure.code, failure.error) == (2, 1, 137, None)
    assert outcome.of_failure(failure, 0).line() == (
        "exit 137 (user on node 1 10.0.0.7, rank 2): rank 2 was killed by SIGKILL (signal 9, "
        "exit 137); not retried")


def test_mpi_abort_gives_the_rank_and_its_errorcode():
    data = (b"MPI_ABORT was invoked on rank 4 in communicator MPI_COMM_WORLD\n"
            b"with errorcode 7.\n\nNOTE: invoking MPI_ABORT causes Open MPI to kill all MPI "
            b"processes.\n")
    failure = conclude(scanned(data), 7, SHAPE)
    assert (failure.rank, failure.node, failure.code) == (4, 2, 7)


def test_users_own_rank_placement_leaves_the_node_to_open_mpi():
    shape = JobShape(TABLE, 0, False, ())
    failure = conclude(scanned(MPIRUN_NON_ZERO), 1, shape)
    assert (failure.rank, failure.node, failure.local_rank) == (3, None, None)
    assert outcome.of_failure(failure, 0, "10.0.0.5").line().startswith(
        "exit 1 (user on node 0 10.0.0.5, rank 3): ")  # where mpirun ran, the rank still named


ELASTIC = """\
Traceback (most recent call last):
  File "/usr/bin/torchrun", line 33, in <module>
    sys.exit(load_entry_point('torch', 'console_scripts', 'torchrun')())
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
/opt/boom.py FAILED
------------------------------------------------------------
Failures:
  <NO_OTHER_FAILURES>
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-29_02:59:22
  host      : node2
  rank      : 5 (local_rank: 1)
  exitcode  : {code} (pid: 15)
  error_file: <N/A>
  traceback : {traceback}
============================================================
"""


def test_torchruns_root_cause_keeps_the_childs_exit_code_not_torchruns_1():
    text = ELASTIC.format(code=7, traceback="To enable traceback see: https://pytorch.org/docs/"
                          "stable/elastic/errors.html")
    failure = conclude(scanned(text.encode()), 1, JobShape(TABLE, 2))
    assert (failure.rank, failure.local_rank, failure.code, failure.host) == (5, 1, 7, "node2")
    assert failure.error is None  # torchrun's own traceback is not the rank's error
    assert outcome.of_failure(failure, 2, "10.0.0.6").line() == (
        "exit 7 (user on node 2 10.0.0.6, rank 5): rank 5 exited with 7; not retried")


def test_torchrun_signal_and_the_workers_traceback():
    worker = (b"Traceback (most recent call last):\n  File \"/opt/boom.py\", line 8\n"
              b"ValueError: boom\n")
    text = ELASTIC.format(code=-9, traceback="Signal 9 (SIGKILL) received by PID 15").encode()
    failure = conclude(scanned(worker + text), 1, JobShape(TABLE, 2))
    assert (failure.code, failure.error) == (137, "ValueError: boom")
    failure = conclude(scanned(text), 1, JobShape(TABLE, 2))
    assert failure.error == "Signal 9 (SIGKILL) received by PID 15"


def test_torchruns_error_file_gives_the_message_and_code(tmp_path):
    path = tmp_path / "error.json"
    path.write_text(json.dumps({"message": {"message": "RuntimeError: NCCL timeout\nmore",
                                            "extraInfo": {"py_callstack": "...",
                                                          "timestamp": "1"},
                                            "errorCode": 3}}))
    failure = conclude(scanned(b"nothing else\n"), 1, JobShape(TABLE, 1), str(path))
    assert (failure.code, failure.error) == (3, "RuntimeError: NCCL timeout")
    assert attribution.read_error_file(str(tmp_path / "missing.json")) is None


PDSH = b"""\
10.0.0.6: Traceback (most recent call last):
10.0.0.6:   File "/opt/boom.py", line 8, in <module>
10.0.0.6:     raise ValueError("boom-rank-5")
10.0.0.6: ValueError: boom-rank-5
10.0.0.6: [2026-11-29 02:59:22,444] [ERROR] [launch.py:325:sigkill_handler] ['/usr/bin/python3', \
'-u', '/opt/boom.py', '--local_rank=1'] exits with return code = 1
10.0.0.7: Traceback (most recent call last):
10.0.0.7: RuntimeError: Connection closed by peer
10.0.0.7: [2026-11-29 02:59:23,001] [ERROR] [launch.py:325:sigkill_handler] ['/usr/bin/python3', \
'-u', '/opt/boom.py', '--local_rank=0'] exits with return code = 1
pdsh@node0: 10.0.0.6: ssh exited with exit code 1
pdsh@node0: 10.0.0.7: ssh exited with exit code 1
"""


def test_deepspeeds_pdsh_lines_name_the_first_host_and_its_local_rank():
    failure = conclude(scanned(PDSH, pdsh=True), 1, SHAPE)
    assert (failure.node, failure.rank, failure.local_rank, failure.code) == (2, 5, 1, 1)
    assert failure.error == "ValueError: boom-rank-5"


def test_the_fatal_exception_of_a_chain_and_not_one_handled_long_before():
    data = (b"Traceback (most recent call last):\n  File \"a\", line 1\nOSError: retrying\n"
            b"step 1\n"
            b"Traceback (most recent call last):\n  File \"a\", line 2\nKeyError: 'x'\n\n"
            b"During handling of the above exception, another exception occurred:\n\n"
            b"Traceback (most recent call last):\n  File \"a\", line 3\n"
            b"RuntimeError: could not load\n")
    scan = Scan()
    scan.feed("stderr", data[:60], 0.0)  # the handled OSError, a minute before the end
    scan.feed("stderr", data[60:], 60.0)
    failure = conclude(scan, 1, SHAPE)
    assert failure.error == "RuntimeError: could not load" and failure.at == 60.0


def test_an_overlong_line_is_passed_by_and_the_next_one_read():
    data = b"x" * 200000 + b"\nTraceback (most recent call last):\n  f\nValueError: after\n"
    failure = conclude(scanned(data, chunk=65536), 1, SHAPE)
    assert failure.error == "ValueError: after"
    assert all(len(buffer) <= attribution.SCAN_LINE_BYTES for buffer in Scan().partial.values())


def test_the_command_alone_is_its_own_status():
    assert conclude(scanned(b"plain output\n"), 0, SHAPE) is None
    failure = conclude(scanned(b"no traceback\n"), 3, SHAPE)
    assert (failure.code, failure.rank, failure.error) == (3, None, None)
    assert outcome.of_failure(failure, 0, "10.0.0.5").line() == (
        "exit 3 (user on node 0 10.0.0.5): the command exited with 3; not retried")


def test_a_childs_report_is_bounded_and_printable():
    failure = Failure.from_wire(7, {"rank": 5, "local_rank": True, "error": "E\x1b[2J" + "y" * 900,
                                    "at": 12.5})
    assert (failure.rank, failure.local_rank, failure.at) == (5, None, 12.5)
    assert "\x1b" not in failure.error and len(failure.error) < 400
    ended = outcome.of_child(2, 7, Failure.from_wire(7, {"rank": 5, "error": "ValueError: boom"}),
                             "10.0.0.6")
    assert ended.line() == "exit 7 (user on node 2 10.0.0.6, rank 5): ValueError: boom"
    # a child stopped from outside, with nothing of its ranks to say, is still a lost host
    assert outcome.of_child(2, 143, None).cls == errors.INFRASTRUCTURE


def test_the_final_line_reads_back_with_its_address_and_rank():
    line = errors.final_line(7, "user", 2, "ValueError: boom", "10.0.0.6", 5)
    found = re.search(errors.FINAL_LINE_PATTERN, line)
    assert found.group("node", "address", "rank", "reason") == (
        "2", "10.0.0.6", "5", "ValueError: boom")
    found = re.search(errors.FINAL_LINE_PATTERN, "exit 200 (infrastructure on node 1,2): x")
    assert found.group("node", "address", "rank") == ("1,2", None, None)


def test_the_first_failure_of_two_nodes_is_the_one_seen_first():
    child = outcome.of_failure(Failure(7, rank=5, error="ValueError: boom", at=10.0), 2)
    own = outcome.of_failure(Failure(1, rank=0, error="RuntimeError: peer closed", at=10.4), 0)
    assert outcome.earliest([own, child]) is child
    assert outcome.earliest([outcome.of_failure(Failure(1), 0), own]) is own


def test_the_main_node_keeps_a_childs_failure_record_and_refuses_a_malformed_one():
    """The rendezvous carries a child's report with its status (``exit`` with ``failure``)."""
    registry = Registry(3, 0)
    conn = SimpleNamespace(index=2, state=NodeState.READY)
    report = {"rank": 5, "local_rank": 1, "error": "ValueError: boom", "at": 12.5}
    assert registry.mark_exited(conn, {"t": "exit", "status": 7, "failure": report}) == 7
    assert registry.failures[2] == report
    for bad in ({"rank": 5, "password": "x"}, ["rank", 5], {"error": "y" * 5000}):
        conn = SimpleNamespace(index=1, state=NodeState.READY)
        with pytest.raises(protocol.ProtocolError):
            registry.mark_exited(conn, {"t": "exit", "status": 1, "failure": bad})
    assert 1 not in registry.failures

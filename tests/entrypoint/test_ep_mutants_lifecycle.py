"""The lifecycle's decisions mutation testing found unchecked (bench/mutation.py): which signals
are forwarded and to whom, the first signal's time, the probe-time interruption, process groups,
what ``terminate``, ``stop_all`` and ``end_group`` leave behind, and exit codes."""

import os
import signal
import sys
import time

import pytest

from entrypoint.run import lifecycle

# sleep(1), not Python: a signal that lands while Python starts up can end it with 1 (or 134)
# instead of 128+N; sleep(1) dies by the default action whenever the signal lands, and Popen
# returns only once the exec is done, so no signal reaches the child before that.
SLEEP = ["sleep", "60"]


@pytest.fixture
def sup():
    supervisor = lifecycle.Supervisor()
    yield supervisor
    for sig in lifecycle.FORWARDED:
        signal.signal(sig, signal.SIG_DFL)
    for proc in supervisor.procs.values():
        if proc.running:
            lifecycle.kill_group(proc.pid)
            proc.popen.wait()


def alive(pid):
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    with open(f"/proc/{pid}/stat") as handle:  # a zombie is not alive
        return handle.read().rsplit(")", 1)[1].split()[0] != "Z"


def test_a_stopped_status_is_exit_code_1():
    stopped = (signal.SIGSTOP << 8) | 0x7F  # what waitpid(WUNTRACED) reports for a stop
    assert lifecycle.exit_code(stopped) == 1


def test_a_new_supervisor_has_seen_no_signal(sup):
    assert (sup.signal_received, sup.stop_requested_at, sup.interruptible) == (None, None, False)
    assert lifecycle.Interrupted(15).signum == 15 and str(lifecycle.Interrupted(15)) == "signal 15"


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT])
def test_every_terminal_signal_is_forwarded_to_the_launcher_only(sup, sig):
    sup.install_signal_handlers()
    launcher = sup.spawn("launcher", SLEEP, forward_signals=True)
    other = sup.spawn("sshd", SLEEP)
    before = time.monotonic()
    os.kill(os.getpid(), sig)
    assert sup.wait_any([launcher], 10) == [launcher]
    assert launcher.code == 128 + sig
    assert sup.signal_received == sig and before <= sup.stop_requested_at <= time.monotonic()
    assert other.running and alive(other.pid)  # not a forwarding target


def test_the_first_signal_and_its_time_are_kept(sup):
    sup.install_signal_handlers()
    os.kill(os.getpid(), signal.SIGTERM)
    first = sup.stop_requested_at
    time.sleep(0.05)
    os.kill(os.getpid(), signal.SIGINT)
    assert (sup.signal_received, sup.stop_requested_at) == (signal.SIGTERM, first)


def test_a_signal_while_probing_interrupts_once(sup):
    sup.install_signal_handlers()
    sup.interruptible = True
    with pytest.raises(lifecycle.Interrupted) as caught:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(1)
    assert caught.value.signum == signal.SIGTERM and sup.interruptible is False
    os.kill(os.getpid(), signal.SIGINT)  # later signals are only recorded
    assert sup.signal_received == signal.SIGTERM


def test_spawned_processes_lead_their_own_group_with_their_env_and_cwd(sup, tmp_path):
    code = "import os; open('out', 'w').write('%d %d %s' % (os.getpid(), os.getpgid(0), " \
           "os.environ['MNP_X']))"
    proc = sup.spawn("t", [sys.executable, "-c", code], env=dict(os.environ, MNP_X="y"),
                     cwd=str(tmp_path))
    sup.wait_any([proc], 10)
    pid, pgid, value = (tmp_path / "out").read_text().split()
    assert (int(pid), int(pgid), value) == (proc.pid, proc.pid, "y")
    assert int(pgid) != os.getpgid(0)


def test_reap_reports_each_end_once_and_keeps_popen_in_step(sup):
    proc = sup.spawn("t", [sys.executable, "-c", "import sys; sys.exit(3)"])
    deadline = time.monotonic() + 10
    ended = []
    while not ended and time.monotonic() < deadline:
        ended = sup.reap()
        time.sleep(0.02)
    assert ended == [proc] and proc.popen.returncode == 3
    assert sup.reap() == []


def test_wait_any_returns_nothing_after_its_timeout(sup):
    proc = sup.spawn("t", SLEEP)
    started = time.monotonic()
    assert sup.wait_any([proc], 0.3) == []
    assert 0.25 <= time.monotonic() - started < 6  # the upper bound: a loaded machine


def test_terminate_sends_the_signal_it_is_given(sup):
    proc = sup.spawn("t", SLEEP)
    assert sup.terminate(proc, 5, sig=signal.SIGINT) == 130


def test_terminate_of_an_ended_process_returns_its_code(sup):
    proc = sup.spawn("t", [sys.executable, "-c", "import sys; sys.exit(4)"])
    sup.wait_any([proc], 10)
    assert sup.terminate(proc, 5) == 4


def test_terminate_leaves_nothing_of_the_group(sup, tmp_path):
    # written then renamed: the shell creates a redirection's file before it writes the pid
    partial, whole = tmp_path / "bg.tmp", tmp_path / "bg"
    script = f"sleep 60 & echo $! > {partial}; mv {partial} {whole}; exec sleep 60"
    proc = sup.spawn("t", ["sh", "-c", script])
    deadline = time.monotonic() + 10
    while not (tmp_path / "bg").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    background = int((tmp_path / "bg").read_text())
    assert sup.terminate(proc, 2) == 143
    deadline = time.monotonic() + 5  # the group's SIGKILL takes effect asynchronously
    while alive(background) and time.monotonic() < deadline:
        sup.reap()
        time.sleep(0.05)
    assert not alive(background)


def test_stop_all_ends_every_running_process(sup):
    procs = [sup.spawn("a", SLEEP), sup.spawn("b", SLEEP)]
    sup.stop_all(2)
    assert [p.code for p in procs] == [143, 143]


def test_end_group_terms_then_kills_what_is_left(sup, tmp_path):
    stubborn = ("import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                "open('ready', 'w').close(); time.sleep(60)")
    leader = sup.spawn("t", [sys.executable, "-c", stubborn], cwd=str(tmp_path))
    polite = sup.spawn("u", SLEEP)
    deadline = time.monotonic() + 10
    while not (tmp_path / "ready").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    reaped = []
    started = time.monotonic()
    lifecycle.end_group(leader.pid, grace=0.5, reap=lambda: reaped.append(sup.reap()))
    assert 0.4 <= time.monotonic() - started < 5  # waited its grace, then SIGKILL
    sup.wait_any([leader], 5)
    assert leader.code == 137 and reaped
    started = time.monotonic()
    lifecycle.end_group(polite.pid, grace=5, reap=sup.reap)
    assert time.monotonic() - started < 4  # returns as soon as the group is gone, not at grace
    sup.wait_any([polite], 5)
    assert polite.code == 143  # SIGTERM was enough
    started = time.monotonic()
    lifecycle.end_group(polite.pid, grace=5)  # the group is gone: returns at once
    lifecycle.kill_group(polite.pid)
    assert time.monotonic() - started < 4  # not the grace of 5 s


def test_spawned_processes_inherit_no_descriptor_of_the_entrypoint(sup, tmp_path):
    """Even one marked inheritable (a listening socket, the rendezvous connection) stays ours."""
    read_end, write_end = os.pipe()
    os.set_inheritable(write_end, True)
    try:
        code = f"import os, sys; sys.exit(0 if not os.path.exists('/proc/self/fd/{write_end}') else 9)"
        proc = sup.spawn("t", [sys.executable, "-c", code])
        sup.wait_any([proc], 10)
        assert proc.code == 0
    finally:
        os.close(read_end)
        os.close(write_end)


PR_SET_CHILD_SUBREAPER = 36  # linux/prctl.h: orphans of our children become ours, as with PID 1


@pytest.fixture
def subreaper():
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    assert libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    yield
    libc.prctl(PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)


def test_orphans_reparented_to_us_are_reaped_and_not_reported(sup, subreaper, tmp_path):
    """As PID 1 the entrypoint inherits every orphan (an sshd session, an ssh the launcher
    left): ``reap`` collects them and reports only the processes it started."""
    proc = sup.spawn("t", ["sh", "-c", f"sleep 0.3 & echo $! > {tmp_path / 'orphan'}; exit 0"])
    sup.wait_any([proc], 10)
    orphan = int((tmp_path / "orphan").read_text())
    deadline = time.monotonic() + 10  # the orphan ends after 0.3 s, later on a loaded machine
    while os.path.exists(f"/proc/{orphan}") and time.monotonic() < deadline:
        assert sup.reap() == []
        time.sleep(0.05)
    assert not os.path.exists(f"/proc/{orphan}")  # collected, no zombie left


def test_end_group_waits_two_seconds_by_default(sup, tmp_path):
    stubborn = ("import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                "open('ready', 'w').close(); time.sleep(60)")
    leader = sup.spawn("t", [sys.executable, "-c", stubborn], cwd=str(tmp_path))
    deadline = time.monotonic() + 10
    while not (tmp_path / "ready").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    started = time.monotonic()
    lifecycle.end_group(leader.pid, reap=sup.reap)
    assert time.monotonic() - started >= 1.9
    sup.wait_any([leader], 5)
    assert leader.code == 137

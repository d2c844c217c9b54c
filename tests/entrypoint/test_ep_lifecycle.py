"""Spawning, reaping, exit codes, signal forwarding."""

import os
import signal
import sys
import time

from entrypoint.run import lifecycle


def test_exit_code_mapping():
    assert lifecycle.exit_code(0) == 0
    assert lifecycle.exit_code(3 << 8) == 3
    assert lifecycle.exit_code(signal.SIGTERM) == 143
    assert lifecycle.exit_code(signal.SIGKILL) == 137


def test_spawn_and_reap_exit_status():
    sup = lifecycle.Supervisor()
    proc = sup.spawn("t", [sys.executable, "-c", "import sys; sys.exit(7)"])
    assert sup.wait_any([proc], 10) == [proc]
    assert proc.code == 7


def test_killed_by_signal_is_128_plus_n():
    sup = lifecycle.Supervisor()
    proc = sup.spawn("t", [sys.executable, "-c", "import os, signal; os.kill(os.getpid(), 9)"])
    sup.wait_any([proc], 10)
    assert proc.code == 137


def test_orphans_are_reaped():
    sup = lifecycle.Supervisor()
    # the shell exits at once, leaving a grandchild; reap() must not choke on unknown pids
    proc = sup.spawn("t", ["sh", "-c", "sleep 0.2 & exit 0"])
    sup.wait_any([proc], 10)
    assert proc.code == 0
    time.sleep(0.4)
    sup.reap()


def test_terminate_escalates_to_sigkill(tmp_path):
    sup = lifecycle.Supervisor()
    # "ready" once SIGTERM is ignored: a SIGTERM before that would end it without escalation
    code = ("import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            "open('ready', 'w').close(); time.sleep(60)")
    proc = sup.spawn("stubborn", [sys.executable, "-c", code], cwd=str(tmp_path))
    deadline = time.monotonic() + 10
    while not (tmp_path / "ready").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    start = time.time()
    assert sup.terminate(proc, 0.5) == 137
    assert time.time() - start < 5
    assert not proc.running


def test_signal_is_forwarded():
    sup = lifecycle.Supervisor()
    sup.install_signal_handlers()
    try:
        # sleep(1) dies by the signal's default action whenever it lands; Popen returns only
        # once the exec is done, so the signal cannot reach the child before that
        proc = sup.spawn("t", ["sleep", "60"], forward_signals=True)
        os.kill(os.getpid(), signal.SIGTERM)
        sup.wait_any([proc], 10)
        assert proc.code == 143
        assert sup.signal_received == signal.SIGTERM
    finally:
        for sig in lifecycle.FORWARDED:
            signal.signal(sig, signal.SIG_DFL)

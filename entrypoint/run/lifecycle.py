"""Processes: spawn, reap, forward signals, turn wait statuses into exit codes.

The entrypoint is PID 1 in the container, so

- it reaps every child that exits, also orphans reparented to it (sshd sessions, ``ssh``
  processes left by the launcher): ``Supervisor.reap`` calls ``waitpid(-1, WNOHANG)`` and keeps the
  status of the processes it started;
- SIGTERM and SIGINT do nothing by default for PID 1: the handlers record the signal and forward
  it to the launcher; if the launcher is still running ``MNP_STOP_TIMEOUT`` seconds later (default
  20, Batch kills after 30), its whole process group gets SIGKILL;
- the exit code is the launcher's: its exit status, or 128+N when a signal N ended it. When the
  entrypoint itself was told to stop by signal N, it exits 128+N (143 for SIGTERM).

Spawned processes get their own process group (``start_new_session``) so a group kill reaches
the launcher's descendants, and terminal signals are forwarded exactly once.
"""

import contextlib
import errno
import os
import signal
import subprocess
import time

from ..core.log import log

FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)


def exit_code(status):
    """A ``waitpid`` status as a shell-style exit code (128+N for a signal)."""
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status)
    if os.WIFEXITED(status):
        return os.WEXITSTATUS(status)
    return 1


class Proc(object):
    def __init__(self, name, popen):
        self.name = name
        self.pid = popen.pid
        self.popen = popen
        self.code = None  # exit code once reaped

    @property
    def running(self):
        return self.code is None


class Interrupted(Exception):
    """A terminal signal arrived while ``Supervisor.interruptible`` was set (device probing):
    nothing has started yet, so the entrypoint just exits 128+N."""

    def __init__(self, signum):
        Exception.__init__(self, "signal %d" % signum)
        self.signum = signum


class Supervisor(object):
    """Starts processes, reaps them (and orphans), forwards signals."""

    def __init__(self):
        self.procs = {}
        self.signal_received = None
        self.stop_requested_at = None  # time.monotonic() of the first signal
        self.interruptible = False  # raise Interrupted from the handler (before anything runs)
        self._forward_to = []

    def install_signal_handlers(self):
        for sig in FORWARDED:
            signal.signal(sig, self._on_signal)

    def _on_signal(self, signum, frame):
        if self.signal_received is None:
            self.signal_received = signum
            self.stop_requested_at = time.monotonic()
        if self.interruptible:
            self.interruptible = False
            raise Interrupted(signum)
        for proc in self._forward_to:
            if proc.running:
                with contextlib.suppress(OSError):
                    os.kill(proc.pid, signum)

    def spawn(self, name, argv, env=None, forward_signals=False, cwd=None, stdout=None,
              stderr=None):
        """Start ``argv`` in its own process group (``stdout``/``stderr``: file descriptors in
        place of this process's own, ``tee``'s pipes)."""
        popen = subprocess.Popen(argv, env=env, cwd=cwd, start_new_session=True,
                                 close_fds=True, stdout=stdout, stderr=stderr)
        proc = Proc(name, popen)
        self.procs[proc.pid] = proc
        if forward_signals:
            self._forward_to.append(proc)
        return proc

    def reap(self):
        """Collect every exited child without blocking; returns the ``Proc``s that ended."""
        ended = []
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            except OSError as exc:
                if exc.errno == errno.EINTR:
                    continue
                break
            if pid == 0:
                break
            proc = self.procs.get(pid)
            if proc is not None and proc.code is None:
                proc.code = exit_code(status)
                # keep Popen from trying to wait for a pid we already reaped
                proc.popen.returncode = proc.code
                ended.append(proc)
        return ended

    def wait_any(self, procs, timeout, poll=0.1):
        """Reap until one of ``procs`` ended or ``timeout`` passed; returns the ended ones."""
        deadline = time.monotonic() + timeout
        while True:
            self.reap()
            done = [p for p in procs if not p.running]
            if done or time.monotonic() >= deadline:
                return done
            time.sleep(min(poll, max(0.0, deadline - time.monotonic())))

    def terminate(self, proc, grace, sig=signal.SIGTERM):
        """Send ``sig`` to ``proc``, SIGKILL its process group after ``grace`` s; wait for it."""
        if not proc.running:
            return proc.code
        with contextlib.suppress(OSError):
            os.kill(proc.pid, sig)
        self.wait_any([proc], grace)
        if proc.running:
            log("%s still running %gs after %s: killing its process group"
                % (proc.name, grace, signal.Signals(sig).name))
            kill_group(proc.pid)
            self.wait_any([proc], 10)
        kill_group(proc.pid)  # leftovers in its group
        return proc.code

    def stop_all(self, grace):
        for proc in list(self.procs.values()):
            if proc.running:
                self.terminate(proc, grace)


def end_group(pgid, grace=2.0, reap=None):
    """Stop what is left in a process group after its leader ended: SIGTERM, then SIGKILL after
    ``grace`` seconds. ``reap`` is called while waiting so that PID 1 collects the zombies."""
    try:
        os.killpg(pgid, signal.SIGTERM)
    except OSError:
        return
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        if reap is not None:
            reap()
        try:
            os.killpg(pgid, 0)
        except OSError:
            return
        time.sleep(0.05)
    kill_group(pgid)


def kill_group(pgid):
    with contextlib.suppress(OSError):
        os.killpg(pgid, signal.SIGKILL)

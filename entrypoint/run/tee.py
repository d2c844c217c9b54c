"""The launcher's stderr (and its stdout, where the launcher reports there) through the entrypoint.

The launcher writes to a pipe; a thread per stream copies every byte on to the entrypoint's own
stream as it arrives, unchanged and unbuffered (``log.write_raw``: never inside one of the
entrypoint's lines), and hands a copy to ``attribution.Scan``, which reads what the launcher and
the ranks say about a failure. A stream that is a terminal (``docker run -t``) is left to the
launcher as it is: a pipe would change how programs write to it (colours, progress bars), and
there the final line names only what the exit status tells.

stdout is passed through only where the launcher reports a failure there (DeepSpeed's per-node
launcher logs to stdout, which pdsh prefixes with the host); elsewhere the program's stdout is the
container's own, with nothing in between.
"""

import os
import threading

from ..core import log as log_mod

FDS = {"stdout": 1, "stderr": 2}
CHUNK = 65536


class Tee(object):
    """Pipes for ``streams`` (names of ``FDS``), copied to this process's streams and fed to
    ``scan`` (``feed(stream, data)``)."""

    def __init__(self, scan, streams=("stderr",)):
        self.scan = scan
        self.streams = [name for name in streams if not _is_terminal(FDS[name])]
        self.pipes = {}  # name -> [read fd, write fd]
        self.threads = []

    def child_streams(self):
        """``subprocess.Popen`` arguments that give the launcher the pipes' write ends."""
        for name in self.streams:
            if name not in self.pipes:
                self.pipes[name] = list(os.pipe())
        return dict((name, pipe[1]) for name, pipe in self.pipes.items())

    def started(self):
        """The launcher has its ends: close ours and start copying."""
        for name, pipe in self.pipes.items():
            os.close(pipe[1])
            pipe[1] = None
            thread = threading.Thread(target=self._pump, args=(name, pipe[0]),
                                      name="mnp-tee-%s" % name)
            thread.daemon = True  # a descendant that keeps the pipe open never blocks the exit
            thread.start()
            self.threads.append(thread)

    def abandon(self):
        """The launcher did not start: close every end."""
        for pipe in self.pipes.values():
            for fd in pipe:
                if fd is not None:
                    os.close(fd)
        self.pipes = {}

    def finish(self, timeout):
        """Wait up to ``timeout`` s for the output to end (every writer gone), so that the final
        line comes after the last byte the ranks wrote."""
        for thread in self.threads:
            thread.join(timeout)

    def _pump(self, name, fd):
        target = FDS[name]
        writable = True
        while True:
            try:
                data = os.read(fd, CHUNK)
            except InterruptedError:
                continue
            except OSError:
                break
            if not data:
                break
            if writable:
                writable = log_mod.write_raw(target, data)
            try:
                self.scan.feed(name, data)
            except Exception as exc:  # the scan must never stop the output
                log_mod.log("reading the launcher's %s for its failure stopped: %s" % (name, exc))
                self.scan = _Ignore()
        os.close(fd)


class _Ignore(object):
    def feed(self, stream, data):
        return None


def _is_terminal(fd):
    try:
        return os.isatty(fd)
    except OSError:
        return False

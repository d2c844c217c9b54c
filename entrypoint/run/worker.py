"""An MPIJob worker (``K_MPI_JOB_ROLE=worker``): serve SSH the way the MPI operator expects.

The operator starts workers with ``command: /usr/sbin/sshd -De`` and mounts its SSH Secret
(``id_rsa``, ``id_rsa.pub``, ``authorized_keys``) at ``sshAuthMountPath``, ``/root/.ssh`` by
default (kubeflow/mpi-operator pkg/controller/mpi_job_controller.go). That bare sshd bypasses
the entrypoint (the image's /usr/sbin/sshd makes the container's host keys: images/ssh/sshd).
The generated MPIJob starts workers through the entrypoint (``args:``), which makes a fresh host
key, and runs sshd on port 22 (the launcher's ``ssh`` uses the default port) with the operator's
``authorized_keys``, keys only, in the foreground until the pod is stopped. The launcher's
``ssh`` accepts the new host key because the entrypoint on the launcher turns off host key
checking for the operator's hosts, as the operator's own base images do in their ssh_config.
"""

import os
import time

from ..core.errors import StartupError
from ..core.log import log
from ..probe import facts
from . import ssh

OPERATOR_PORT = 22  # the launcher's ssh has no -p: the default port
KEYS_DIR = "/root/.ssh"  # the operator's default sshAuthMountPath


def authorized_keys_path(home):
    """The operator's ``authorized_keys``: under ``~/.ssh`` (``/root/.ssh`` for root)."""
    return os.path.join(home or "/root", ".ssh", "authorized_keys")


def serve(runner):
    """Run sshd for the MPIJob launcher until a signal or sshd's exit; return the exit code."""
    cfg = runner.cfg
    if runner.command:  # e.g. the operator's default worker command, passed as args
        log("MPIJob worker: the launcher's mpirun starts the ranks here; not running %s"
            % " ".join(runner.command))
    keys = authorized_keys_path(runner.facts.home)
    if not os.path.isfile(keys):
        raise StartupError("%s is missing: an MPIJob worker takes the launcher's key from the "
                           "operator's SSH Secret, mounted at sshAuthMountPath (default %s)"
                           % (keys, KEYS_DIR))
    sshd = facts.find_sshd()
    if sshd is None:
        raise StartupError("sshd not found (install openssh-server): an MPIJob worker serves "
                           "SSH for the launcher")
    runner.make_state_dir()
    paths = ssh.Paths(cfg.state_dir)
    ssh.prepare_server(paths, OPERATOR_PORT, runner.user, "mnp-mpijob-worker")
    paths.authorized_keys = keys
    with open(paths.sshd_config, "w") as handle:
        handle.write(ssh.sshd_config_text(paths, OPERATOR_PORT, runner.user))
    proc = runner.sup.spawn("sshd", ssh.sshd_argv(sshd, paths))
    if not ssh.wait_listening(paths.pid_file, OPERATOR_PORT, 15,
                              alive=lambda: runner.alive(proc)):
        raise StartupError("sshd did not start listening on port %d (exit code %s)"
                           % (OPERATOR_PORT, proc.code))
    log("MPIJob worker: sshd listening on port %d with the operator's keys (%s)"
        % (OPERATOR_PORT, keys))
    while True:
        runner.sup.reap()
        if runner.sup.signal_received:
            sig = runner.sup.signal_received
            log("signal %d: stopping sshd" % sig)
            runner.sup.stop_all(min(cfg.stop_timeout, 10))
            return 128 + sig
        if not proc.running:
            log("sshd exited with %s" % proc.code)
            return proc.code or 1
        time.sleep(0.1)

"""Per-job SSH, with no key baked into any image.

- Every node that takes SSH logins (all nodes, for mpirun and deepspeed) makes its own ed25519
  *host* key at start (``ssh-keygen``) and runs its own ``sshd`` from a generated config: keys
  only (no passwords, no keyboard-interactive, no PAM), the port from ``MNP_SSH_PORT``,
  ``AuthorizedKeysFile`` in the per-job directory, forwarding off, ``AllowUsers`` this user.
- The main node makes the job's *client* key pair. Children send their host public key in the
  rendezvous and receive the main node's client public key for their ``authorized_keys``.
- The main node writes a per-job ``known_hosts`` with every node's host key and an ``ssh_config``
  with ``StrictHostKeyChecking yes``, ``BatchMode yes`` and that ``known_hosts`` only.
  Tools find it through ``OMPI_MCA_plm_rsh_args=-F <ssh_config>``, ``PDSH_SSH_ARGS_APPEND`` and,
  when the user has none, ``~/.ssh/config`` (an ``Include`` line), so plain ``ssh`` works too.

Only public keys cross the network. Private keys stay in ``$MNP_STATE_DIR/ssh`` (mode 0700).
"""

import contextlib
import os
import re
import shutil
import subprocess
import time

from ..launchers.base import NODE_SSH_ENV

HOST_RE = re.compile(r"^[0-9A-Za-z.:-]+$")  # IPv4 literals (and host names in tests)


class SshError(Exception):
    pass


def keygen(path, comment):
    """Make an ed25519 key pair at ``path`` (replacing any old one); return the public key."""
    for old in (path, path + ".pub"):
        if os.path.exists(old):
            os.unlink(old)
    tool = shutil.which("ssh-keygen")
    if tool is None:
        raise SshError("ssh-keygen is not installed (install openssh-client)")
    proc = subprocess.Popen([tool, "-q", "-N", "", "-t", "ed25519", "-C", comment, "-f", path],
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)
    out, _ = proc.communicate()
    if proc.returncode != 0:
        raise SshError("ssh-keygen failed: %s" % out.decode("utf-8", "replace").strip())
    with open(path + ".pub") as handle:
        parts = handle.read().split()
    return " ".join(parts[:2])


class Paths(object):
    def __init__(self, state_dir):
        self.dir = os.path.join(state_dir, "ssh")
        self.host_key = os.path.join(self.dir, "ssh_host_ed25519_key")
        self.sshd_config = os.path.join(self.dir, "sshd_config")
        self.authorized_keys = os.path.join(self.dir, "authorized_keys")
        self.pid_file = os.path.join(self.dir, "sshd.pid")
        self.client_key = os.path.join(self.dir, "id_ed25519")
        self.known_hosts = os.path.join(self.dir, "known_hosts")
        self.ssh_config = os.path.join(self.dir, "ssh_config")

    def make(self):
        os.makedirs(self.dir, mode=0o700, exist_ok=True)
        os.chmod(self.dir, 0o700)


def sshd_config_text(paths, port, user):
    root_login = "prohibit-password" if user == "root" else "no"
    return "\n".join([
        "# mnp-entrypoint: per-job sshd, public keys only",
        "Port %d" % port,
        "ListenAddress 0.0.0.0",
        "HostKey %s" % paths.host_key,
        "PidFile %s" % paths.pid_file,
        "AuthorizedKeysFile %s" % paths.authorized_keys,
        "PubkeyAuthentication yes",
        "PasswordAuthentication no",
        "PermitEmptyPasswords no",
        "ChallengeResponseAuthentication no",
        "KbdInteractiveAuthentication no",
        "HostbasedAuthentication no",
        "UsePAM no",
        "PermitRootLogin %s" % root_login,
        "AllowUsers %s" % user,
        "StrictModes no",
        "X11Forwarding no",
        "AllowTcpForwarding no",
        "AllowAgentForwarding no",
        "PermitTunnel no",
        "PermitUserEnvironment yes",  # for the environment= options of the job's key
        "PrintMotd no",
        "ClientAliveInterval 15",
        "ClientAliveCountMax 4",
        "MaxStartups 200:30:1000",
        "LogLevel INFO",
        "",
    ])


def client_config_text(paths, port, user, hosts):
    """The per-job client settings, for the job's node addresses only: ``~/.ssh/config``
    includes this file, so a ``Host *`` here would send every ssh and git of the node (to
    github.com, say) to the job's port with the job's known_hosts."""
    hosts = sorted(set(hosts))
    if not hosts or not all(HOST_RE.match(h) for h in hosts):
        raise SshError("not node addresses: %r" % (hosts,))
    return "\n".join([
        "# mnp-entrypoint: per-job ssh client settings, for this job's nodes only",
        "Host %s" % " ".join(hosts),
        "    Port %d" % port,
        "    User %s" % user,
        "    IdentityFile %s" % paths.client_key,
        "    IdentitiesOnly yes",
        "    UserKnownHostsFile %s" % paths.known_hosts,
        "    GlobalKnownHostsFile /dev/null",
        "    StrictHostKeyChecking yes",
        "    HashKnownHosts no",
        "    BatchMode yes",
        "    PasswordAuthentication no",
        "    ConnectTimeout 10",
        "    ConnectionAttempts 10",
        "    ServerAliveInterval 15",
        "    ServerAliveCountMax 4",
        "    LogLevel ERROR",
        "",
    ])


def known_hosts_text(nodes, port):
    lines = []
    for node in sorted(nodes, key=lambda n: n.index):
        if not node.host_key:
            continue
        host = node.address if port == 22 else "[%s]:%d" % (node.address, port)
        lines.append("%s %s\n" % (host, node.host_key))
    return "".join(lines)


def _write(path, text, mode=0o600):
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w") as handle:
        handle.write(text)
    os.rename(tmp, path)


def prepare_server(paths, port, user, comment):
    """Host key, empty ``authorized_keys`` and ``sshd_config``; returns the host public key."""
    paths.make()
    if os.path.exists(paths.pid_file):
        os.unlink(paths.pid_file)
    host_pub = keygen(paths.host_key, comment)
    _write(paths.authorized_keys, "")
    _write(paths.sshd_config, sshd_config_text(paths, port, user))
    if os.geteuid() == 0:
        for priv_sep in ("/run/sshd", "/var/run/sshd", "/var/empty"):
            with contextlib.suppress(OSError):
                os.makedirs(priv_sep, mode=0o755, exist_ok=True)
    return host_pub


_OPTION_VALUE_RE = re.compile(r'^[^"\\\x00-\x1f\x7f]*$')


def key_options(environ):
    """``environment="NAME=value"`` options for this node's ``NODE_SSH_ENV`` values (a value
    with a quote, a backslash or a control character is left out: it cannot be written safely)."""
    options = []
    for name in NODE_SSH_ENV:
        value = environ.get(name)
        if value is not None and _OPTION_VALUE_RE.match(value):
            options.append('environment="%s=%s"' % (name, value))
    return ",".join(options)


def authorize(paths, public_key, environ=None):
    """The job's client key as the only ``authorized_keys`` line, with this node's own values of
    ``NODE_SSH_ENV`` for every session it opens (sshd's ``PermitUserEnvironment yes``)."""
    options = key_options(environ or {})
    _write(paths.authorized_keys, (options + " " if options else "") + public_key.strip() + "\n")


def prepare_client(paths, port, user, comment, own_address):
    """The job's client key pair and ``ssh_config`` (this node only until the rendezvous);
    returns the client public key."""
    paths.make()
    pub = keygen(paths.client_key, comment)
    _write(paths.ssh_config, client_config_text(paths, port, user, [own_address]))
    _write(paths.known_hosts, "")
    return pub


def write_known_hosts(paths, nodes, port, user):
    """``known_hosts`` and the ``ssh_config`` scoped to the job's node addresses."""
    _write(paths.known_hosts, known_hosts_text(nodes, port), 0o644)
    _write(paths.ssh_config, client_config_text(paths, port, user,
                                                [n.address for n in nodes]))


def install_user_config(paths):
    """Add ``Include <ssh_config>`` as ``~/.ssh/config`` unless the user has one. Returns a note."""
    home = os.path.expanduser("~")
    target = os.path.join(home, ".ssh", "config")
    if os.path.exists(target):
        return "kept the existing %s (use -F %s)" % (target, paths.ssh_config)
    try:
        os.makedirs(os.path.dirname(target), mode=0o700, exist_ok=True)
        _write(target, "Include %s\n" % paths.ssh_config)
    except OSError as exc:
        return "could not write %s: %s" % (target, exc)
    return "wrote %s (Include %s)" % (target, paths.ssh_config)


def sshd_argv(sshd, paths):
    return [sshd, "-D", "-e", "-f", paths.sshd_config]


def wait_listening(pid_file, port, timeout, alive=None):
    """Wait until sshd listens: it writes ``pid_file`` after binding its port (a TCP probe would
    log a failed connection). False on timeout or if ``alive()`` turns False (sshd exited)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if alive is not None and not alive():
            return False
        try:
            with open(pid_file) as handle:
                if handle.read().strip():
                    return True
        except (OSError, IOError):
            pass
        time.sleep(0.05)
    return False

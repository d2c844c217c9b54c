"""Kubeflow MPIJob v2beta1 (mpi-operator): a launcher pod runs mpirun over SSH to worker pods.

Both roles get ``K_MPI_JOB_ROLE`` (``launcher`` or ``worker``); only the launcher gets the
ConfigMap at ``/etc/mpi`` (``newLauncherPodTemplate`` mounts it; a worker pod has no hostfile and
needs none: the launcher's mpirun reaches it over SSH). The launcher runs no ranks unless the
job sets ``runLauncherAsWorker``, which lists it first in the hostfile; it plans for the ranks
(mpirun passes its variables to them) but does not check the devices on itself
(``runs_ranks``). The launcher of an Open MPI job gets
``OMPI_MCA_orte_default_hostfile=/etc/mpi/hostfile`` (one
``<job>-worker-<i>.<job>.<ns>.svc slots=N`` line per worker), ``OMPI_MCA_orte_keep_fqdn_hostnames``,
``OMPI_MCA_plm_rsh_args`` and ``OMPI_MCA_orte_set_default_slots``; Intel MPI's launcher gets
``I_MPI_HYDRA_HOST_FILE`` and MPICH's ``HYDRA_HOST_FILE`` (lines ``host:N``). SSH keys are a Secret
at ``/root/.ssh``; the operator wires the nodes (DNS, hostfile, keys), the entrypoint does not.
"""

import ipaddress
import os
import re
from typing import Dict, List, Mapping, Optional, Tuple

from ..core.errors import ConfigError
from .base import MAX_NODES, MAX_SLOTS, STARTED, LauncherSsh, NodeTable, first, get

NAME = "mpijob"
PRECEDENCE = 30  # between equally sure adapters (schedulers/__init__.py says why)
SUBMITTED = True  # whether a job is submitted to it (base.ADAPTER_CONTRACT)
NODE_PREFIXES = ()  # per-process variable prefixes (base.ADAPTER_CONTRACT)
SOURCE = ("https://github.com/kubeflow/mpi-operator/blob/master/pkg/controller/"
          "mpi_job_controller.go (launcher and worker env, hostfile ConfigMap)")
ROLE = "K_MPI_JOB_ROLE"
HOSTFILES = ("OMPI_MCA_orte_default_hostfile", "I_MPI_HYDRA_HOST_FILE", "HYDRA_HOST_FILE")
DEFAULT_HOSTFILE = "/etc/mpi/hostfile"
SIGNALS = (ROLE,)
MAX_HOSTFILE_BYTES = 4 * 1024 * 1024
HOST_LABEL_RE = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?$")
# The launcher's ssh: the operator's OMPI_MCA_plm_rsh_args plus no host key checking, since every
# worker makes its host key when it starts (``run.worker``) and the operator distributes none
# (its base images say ``StrictHostKeyChecking no`` in ssh_config).
LAUNCHER_SSH = LauncherSsh(
    "-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null",
    "the operator's ssh options, and no host key checking: each worker makes its host key at "
    "start", "kubeflow/mpi-operator pkg/controller/mpi_job_controller.go (OMPI_MCA_plm_rsh_args)")


def detect(env: Mapping[str, str]) -> Optional[str]:
    return first(env, ROLE)


def trust(env: Mapping[str, str]) -> Tuple[int, str]:
    return STARTED, "the MPI operator sets it on the launcher and worker pods it makes"


def table(env: Mapping[str, str]) -> NodeTable:
    role = (get(env, ROLE) or "").lower()
    if role == "worker":
        return NodeTable(NAME, ROLE, "worker", node_rank=None, num_nodes=None,
                         extra={"sshd": "the launcher reaches this pod over SSH"})
    if role != "launcher":
        raise ConfigError(ROLE, "%r is not launcher or worker" % (get(env, ROLE) or ""))
    name = first(env, *HOSTFILES)
    path = get(env, name) if name else DEFAULT_HOSTFILE
    extra = {"hostfile": "%s (%s)" % (path, name or "the operator's default path")}
    hosts, slots = read_hostfile(path or DEFAULT_HOSTFILE, name or ROLE)
    if hosts is None:
        extra["hostfile"] += ": not there"
        return NodeTable(NAME, ROLE, "launcher", node_rank=None, num_nodes=None, extra=extra,
                         launcher_ssh=LAUNCHER_SSH, problems=[_no_hostfile(name, path)],
                         runs_ranks=False)
    return NodeTable(NAME, ROLE, "launcher", node_rank=None, num_nodes=len(hosts), hosts=hosts,
                     slots=slots, extra=extra, launcher_ssh=LAUNCHER_SSH,
                     runs_ranks=launcher_is_worker(env, hosts))


def _no_hostfile(name: Optional[str], path: str) -> str:
    """The launcher cannot know its workers: say which file, from which variable, and what the
    operator mounts there (the launcher's ConfigMap at ``/etc/mpi``, key ``hostfile``)."""
    said = "%s=%s" % (name, ascii(path)) if name else "%s=launcher: %s (the operator's default)" % (
        ROLE, DEFAULT_HOSTFILE)
    return ("%s %s, so this MPIJob launcher knows no worker: the MPI operator mounts the job's "
            "ConfigMap (<job>-config; a TrainJob's <trainjob>-mpi-hostfile) with its hostfile at "
            "/etc/mpi on the launcher pod only; run this as the launcher of an MPIJob, or mount a "
            "hostfile that lists the workers and name it in %s" % (
                said, "is not a file" if os.path.exists(path) else "is not there",
                name or HOSTFILES[0]))


def read_hostfile(path: str, variable: str) -> Tuple[Optional[List[str]], Optional[List[int]]]:
    """Hosts and slots of an MPI hostfile (``host slots=N``, ``host:N`` or ``host``); ``(None,
    None)`` when the file does not exist (a dry run away from the pod). Slots are None unless
    every line gives them."""
    if not os.path.isfile(path):
        return None, None
    try:
        with open(path, "rb") as handle:
            data = handle.read(MAX_HOSTFILE_BYTES + 1)
    except (OSError, IOError) as exc:
        raise ConfigError(variable, "cannot read %s: %s" % (ascii(path), exc.strerror)) from None
    if len(data) > MAX_HOSTFILE_BYTES:
        raise ConfigError(variable, "%s is larger than %d bytes" % (ascii(path), MAX_HOSTFILE_BYTES))
    hosts, slots = [], []  # type: List[str], List[Optional[int]]
    for number, line in enumerate(data.decode("utf-8", "replace").splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        host, count = _hostfile_line(line, "%s line %d" % (ascii(path), number), variable)
        hosts.append(host)
        slots.append(count)
    if not hosts:
        raise ConfigError(variable, "%s names no host" % ascii(path))
    if len(hosts) > MAX_NODES:
        raise ConfigError(variable, "%s names more than %d hosts" % (ascii(path), MAX_NODES))
    if any(count is None for count in slots):
        return hosts, None
    return hosts, [int(count or 0) for count in slots]


def _hostfile_line(line: str, where: str, variable: str) -> Tuple[str, Optional[int]]:
    words = line.split()
    host, count = _host_and_count(words[0])
    if not valid_host(host):
        raise ConfigError(variable, "%s: %s is not a host name (RFC 1123: dot-separated labels of "
                          "letters, digits and inner '-', at most 63 characters each) or an IP "
                          "address" % (where, ascii(host)))
    for word in words[1:]:  # max_slots and other keys do not change what the launcher gets
        if word.startswith("slots="):
            count = word[len("slots="):]
    if count is not None:
        if not count.isdigit() or not 1 <= int(count) <= MAX_SLOTS:
            raise ConfigError(variable, "%s: %r is not a slot count 1-%d" % (where, count, MAX_SLOTS))
        return host, int(count)
    return host, None


def _host_and_count(word: str) -> Tuple[str, Optional[str]]:
    """``host`` or ``host:N`` (Intel MPI, MPICH); an IPv6 literal (more than one ``:``) is a
    host without a count."""
    if word.count(":") == 1:
        host, count = word.split(":")
        return host, count
    return word, None


def valid_host(host: str) -> bool:
    """An IPv4 or IPv6 literal, or a host name as RFC 1123 section 2.1 allows it (RFC 952's
    letters, digits and hyphens, a label may start with a digit; labels of 1-63 characters and a
    name of at most 253 in text, RFC 1035 section 2.3.4;
    https://www.rfc-editor.org/rfc/rfc1123#section-2.1), one final ``.`` allowed (an absolute
    name). All-numeric dotted names must be IPv4 addresses: RFC 1123 keeps the top label
    non-numeric so the two cannot be confused. Anything else (``host;``, ``$(x)``) reaches no
    launcher's command line."""
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        pass
    name = host[:-1] if host.endswith(".") else host
    if not name or len(name) > 253 or not all(HOST_LABEL_RE.match(x) for x in name.split(".")):
        return False
    return not name.split(".")[-1].isdigit()


def launcher_is_worker(env: Mapping[str, str], hosts: List[str]) -> bool:
    """True when the hostfile lists this pod (``runLauncherAsWorker``: the launcher first, as
    ``<job>-launcher.<job>...``): Kubernetes sets ``HOSTNAME`` to the pod's hostname."""
    me = get(env, "HOSTNAME")
    return bool(me) and any(host.split(".", 1)[0] == me for host in hosts)


def example(num_nodes: int, node_rank: int = 0) -> Dict[str, str]:
    """What an Open MPI MPIJob's launcher pod gets (``node_rank`` is unused: the launcher is not
    one of the workers); its hostfile exists only in the pod."""
    return {"K_MPI_JOB_ROLE": "launcher", "OMPI_MCA_orte_default_hostfile": DEFAULT_HOSTFILE,
            "OMPI_MCA_orte_keep_fqdn_hostnames": "true",
            "OMPI_MCA_plm_rsh_args": "-o ConnectionAttempts=10",
            "OMPI_MCA_orte_set_default_slots": "1"}

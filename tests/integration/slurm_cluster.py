"""A real Slurm cluster in containers of the stack image, for tests: 1 slurmctld + N slurmd.

The test-only layer adds Debian's ``slurm-wlm``, ``munge`` and ``libpmix-dev`` to the image under
test (cpu-tcp), so ``srun`` tasks run inside the real image with the variables Slurm really sets,
as pyxis runs them on a cluster. Measured recipe (Slurm 22.05 on Debian 12):

- ``ProctrackType=proctrack/linuxproc`` and ``TaskPlugin=task/none``: no cgroup plugin, so the
  containers need no extra capability and no privilege;
- ``docker run --init``: slurmd double-forks slurmstepd and does not reap it; as PID 1 it would
  leave one zombie per step;
- ``libpmix-dev``: Slurm's ``mpi_pmix_v4.so`` dlopens the unversioned ``libpmix.so``, which only
  the -dev package ships; without it ``srun --mpi=pmix`` fails ("can not load PMIx library").
  Debian's Open MPI has no PMI-1/PMI-2 support, so ``--mpi=pmi2`` cannot work with it;
- munge's key is generated when the package installs, so every container of the layer shares it;
- ``gpus_per_node``: GRES over fake ``/dev/nvidiaN`` (``mknod``, allowed by Docker's default
  capabilities) gives tasks ``SLURM_GPUS_ON_NODE`` and ``CUDA_VISIBLE_DEVICES`` with no GPU;
- ``pyxis_images``: the pyxis play (``pyxis_play.py``) as ``srun`` on every node, with the images
  it may "import" (enroot URI -> the docker image's config), so ``srun --container-image=...``
  lines of generated scripts run as pyxis would run them;
- ``requeue_wait_s``: how long a requeued job waits before it may start again;
- ``user_run``: every node's ``/run`` open to the submitting user's tasks, standing in for the
  tmpfs enroot mounts there in each container (for a cluster that runs that user's jobs only).
  Every node has the user ``USER`` (``run(..., user=USER)`` submits as it).

Containers are named ``mnp-slurm-<id>-<node>`` and carry the label ``mnp-test=1``; Slurm's node
names (``slurmctl``, ``node1`` ...) are their host names and network aliases on a private bridge
network. ``cleanup`` removes what it created, nothing else.
"""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from pathlib import Path

from tests.integration.pods import layer_image

LAYER = """\
ARG BASE
FROM ${BASE}
# Test-only: a Slurm controller/compute node inside the stack image (tests/integration).
RUN apt-get update \\
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \\
      slurm-wlm munge libpmix-dev \\
 && rm -rf /var/lib/apt/lists/* \\
 && test -e /usr/lib/x86_64-linux-gnu/pmix2/lib/libpmix.so \\
 && test -s /etc/munge/munge.key
"""

# MinJobAge=4: a finished job's record stays at least 4 s, and `sbatch --wait` polls every 2 s.
# Its poll interval starts at 2 s and grows fourfold only while it is below MinJobAge/2 (SchedMD/
# slurm src/sbatch/sbatch.c, _job_wait, slurm-22-05-8-1; capped at MAX_WAIT_SLEEP_TIME, 32 s):
# with the default 300 s, a job done after 11 s was seen at 42 s. The manual's "zero prevents any
# job record purging" does not hold in 22.05: src/common/read_config.c (slurm-22-05-8-1, lines
# 4392-4397) raises any MinJobAge below 2 to 2, and slurmctld then purges a finished job every
# MAX(10, MinJobAge) s once it is MinJobAge s old (src/slurmctld/controller.c 2021-2024,
# job_mgr.c _list_find_job_old). At 0 (so 2), `scontrol show job` right after `sbatch --wait`
# sometimes found no job. The tests read a job's record in the shell that waited for it.
SLURM_CONF = """\
ClusterName=mnp
SlurmctldHost=slurmctl
AuthType=auth/munge
CryptoType=crypto/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
MpiDefault=none
ReturnToService=2
SlurmctldTimeout=30
SlurmdTimeout=30
KillWait=5
MinJobAge=4
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
NodeName=node[1-{nodes}] CPUs=2 RealMemory=1000{gres} State=UNKNOWN
PartitionName=main Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""

START = """\
#!/bin/sh
set -e
mkdir -p /var/log/slurm /var/spool/slurmctld /var/spool/slurmd /run/munge
chown munge:munge /run/munge
# fake GPUs for GRES: character devices with NVIDIA's major number, nothing behind them
i=0
while [ "$i" -lt "${FAKE_GPUS:-0}" ]; do
  [ -e /dev/nvidia$i ] || mknod /dev/nvidia$i c 195 $i
  i=$((i+1))
done
# a submitting user, the same on every node (enroot's 10-shadow hook gives its containers the
# host's user), and the runtime folder pyxis keeps per node, open to that user's tasks
id -u {user} >/dev/null 2>&1 || useradd -u {uid} -m -s /bin/sh {user}
mkdir -p /run/pyxis-play && chmod 1777 /run/pyxis-play
if [ "${PYXIS_USER_RUN:-0}" = 1 ]; then
  # enroot mounts a tmpfs on /var/run (/run here) in each container, the user's own
  # (NVIDIA/enroot conf/mounts/10-system.fstab:5 at 102be94b): the user's tasks may write there
  chmod 1777 /run
fi
su -s /bin/sh munge -c /usr/sbin/munged
if [ "$1" = ctl ]; then exec /usr/sbin/slurmctld -D -i; else exec /usr/sbin/slurmd -D; fi
"""


PLAY = Path(__file__).with_name("pyxis_play.py")
# The user that submits jobs as a cluster's users do (not root); same name and UID on every node.
USER, UID = "mnpuser", 1000


def image_config(client, image: str) -> dict:
    """What enroot keeps of a docker image's config: its ENV, ENTRYPOINT, CMD and WORKDIR."""
    config = client.images.get(image).attrs["Config"]
    return {key: config.get(key) for key in ("Env", "Entrypoint", "Cmd", "WorkingDir")}


def slurm_image(client, base: str) -> str:
    """The base image plus the Slurm layer, built once per base image (reused while cached)."""
    return layer_image(client, base, LAYER, "slurm")


class SlurmCluster:
    """``start()`` the controller and ``nodes`` compute nodes, ``wait_ready()``, then ``run``
    commands on the controller (the submit host) with ``srun``/``sbatch``; ``cleanup()``."""

    def __init__(self, client, image: str, workdir: Path, nodes: int = 3,
                 gpus_per_node: int = 0, pyxis_images: dict | None = None,
                 start_timeout: float = 60, requeue_wait_s: int | None = None,
                 shm_size: str = "256m", user_run: bool = False) -> None:
        self.client = client
        self.shm_size = shm_size  # each node's /dev/shm (a host's, which pyxis' containers share)
        # /run open to the user's tasks, as enroot's per-container tmpfs is (one user's jobs only:
        # a root job's leftovers there would not be the user's, where enroot starts each afresh)
        self.user_run = user_run
        self.image = image
        self.nodes = [f"node{i + 1}" for i in range(nodes)]
        self.prefix = f"mnp-slurm-{uuid.uuid4().hex[:8]}"
        self.etc = workdir / "etc-slurm"
        self.share = workdir / "share"
        self.etc.mkdir(parents=True)
        self.share.mkdir(parents=True)
        self.gpus = gpus_per_node
        conf = SLURM_CONF.format(nodes=nodes, gres=f" Gres=gpu:{self.gpus}" if self.gpus else "")
        if self.gpus:  # Slurm's GRES over fake /dev/nvidiaN: SLURM_GPUS_ON_NODE and friends
            conf = "GresTypes=gpu\n" + conf
            (self.etc / "gres.conf").write_text(
                f"NodeName=node[1-{nodes}] Name=gpu File=/dev/nvidia[0-{self.gpus - 1}]\n")
        if requeue_wait_s:  # slurm.conf(5) AuthInfo cred_expire: also how long a requeued job
            # waits before it may start again (default 120 s)
            conf = f"AuthInfo=cred_expire={requeue_wait_s}\n" + conf
        (self.etc / "slurm.conf").write_text(conf)
        (self.etc / "start.sh").write_text(START.replace("{user}", USER).replace("{uid}", str(UID)))
        self.pyxis = pyxis_images is not None
        if self.pyxis:
            (self.etc / "pyxis-play").mkdir()
            (self.etc / "pyxis-play" / "images.json").write_text(json.dumps(
                {"images": pyxis_images, "start_timeout": start_timeout}, indent=1))
        self.containers: list = []
        self.network = client.networks.create(self.prefix, driver="bridge",
                                              labels={"mnp-test": "1"})

    def _start(self, name: str, role: str):
        volumes = [f"{self.etc}:/etc/slurm:ro", f"{self.share}:/share:rw"]
        if self.pyxis:  # before Slurm's /usr/bin/srun on PATH, and the per-task wrapper
            volumes += [f"{PLAY}:/usr/local/bin/srun:ro", f"{PLAY}:/usr/local/bin/pyxis-task:ro"]
        endpoint = self.client.api.create_endpoint_config(aliases=[name])
        container = self.client.containers.create(
            self.image, [role], entrypoint=["/bin/sh", "/etc/slurm/start.sh"], init=True,
            name=f"{self.prefix}-{name}", hostname=name,
            network=self.network.name, networking_config={self.network.name: endpoint},
            volumes=volumes, labels={"mnp-test": "1"}, shm_size=self.shm_size,
            environment={"FAKE_GPUS": str(self.gpus if role == "node" else 0),
                         "PYXIS_USER_RUN": "1" if self.user_run else "0"})
        self.containers.append(container)  # before start: cleanup removes it if start fails
        container.start()
        return container

    def start(self) -> SlurmCluster:
        self.controller = self._start("slurmctl", "ctl")
        for node in self.nodes:
            self._start(node, "node")
        return self

    def run(self, command: str, timeout: float = 120, user: str = "root") -> tuple[int, str]:
        """``sh -c command`` on the controller as ``user`` (a login shell's environment for
        any other user); ``(exit status, stdout+stderr)``."""
        argv = ["timeout", f"{timeout:.0f}", "sh", "-c", command]
        if user != "root":
            argv = ["timeout", f"{timeout:.0f}", "su", "-s", "/bin/sh", user, "-c", command]
        result = self.controller.exec_run(argv, demux=False)
        return result.exit_code, result.output.decode("utf-8", "replace")

    def wait_ready(self, timeout: float = 90) -> float:
        """Seconds until ``sinfo`` shows every node idle; raises with the daemons' logs."""
        started = time.monotonic()
        deadline = started + timeout
        output = ""
        while time.monotonic() < deadline:
            code, output = self.run("sinfo -h -t idle -o %D", timeout=10)
            if code == 0 and output.strip() == str(len(self.nodes)):
                return time.monotonic() - started
            time.sleep(0.5)
        raise AssertionError(f"the Slurm cluster was not ready in {timeout:g}s (sinfo: "
                             f"{output!r})\n{self.logs()}")

    def logs(self, name: str | None = None) -> str:
        out = []
        for container in self.containers:
            if name and not container.name.endswith("-" + name):
                continue
            try:
                text = container.exec_run(["sh", "-c", "tail -n 30 /var/log/slurm/*.log"])[1]
            except Exception:  # noqa: BLE001 - a container that exited has no exec
                text = b"(not running)\n"
            logs = container.logs(tail=20).decode("utf-8", "replace")
            out.append(f"== {container.name}\n{logs}{text.decode('utf-8', 'replace')}")
        return "\n".join(out)

    def cleanup(self) -> None:
        for container in self.containers:
            with contextlib.suppress(Exception):  # already gone
                container.remove(force=True)
        with contextlib.suppress(Exception):
            self.network.remove()

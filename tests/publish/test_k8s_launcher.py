"""The MPIJob launcher of an EFA stack: the entrypoint's plan there, from the generated env.

The launcher pod has no ``vpc.amazonaws.com/efa`` device and runs no ranks (mpi-operator runs
ranks on the workers unless ``runLauncherAsWorker``), yet its plan is what mpirun hands every
rank: ``-x NAME`` for each variable it sets (``NCCL_NET``, ``LD_LIBRARY_PATH``, ``MNP_FABRIC``).
So the launcher must plan the workers' fabric (EFA) without checking EFA on itself. Setting
``MNP_FABRIC=tcp`` on the launcher would pass its preflight and move every rank to NCCL's
sockets (``NCCL_NET=Socket`` where aws-ofi-nccl is installed, entrypoint/plan/envtable.py), so the
generator cannot fix this alone: the entrypoint skips the device preflight on an MPIJob launcher
(its ``NodeTable.runs_ranks`` is False, issue 23) and still plans EFA for the ranks.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.helpers import written

ROOT = Path(__file__).resolve().parents[2]
IMAGE = "123456789012.dkr.ecr.us-east-1.amazonaws.com/mnp/cuda@sha256:" + "b" * 64


def launcher_plan(tmp_path: Path, hostname: str = "mnp-launcher",
                  hosts: str = "mnp-worker-0.mnp slots=8\nmnp-worker-1.mnp slots=8\n") -> dict:
    """The entrypoint's dry-run plan (JSON) in the generated launcher's environment, with the
    operator's variables (K_MPI_JOB_ROLE, the hostfile) of kubeflow/mpi-operator's launcher."""
    manifest = written("k8s", "--kind", "mpijob", "--stack", "cuda11.7-efa", "--nodes", "2",
                       "--instance-type", "p4d.24xlarge", "--image-uri", IMAGE,
                       command=["/opt/nccl-tests/bin/all_reduce_perf"])
    pod = manifest["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]
    env = {e["name"]: e["value"].replace("$$", "$") for e in pod["containers"][0]["env"]}
    hostfile = tmp_path / "hostfile"
    hostfile.write_text(hosts)
    env.update(K_MPI_JOB_ROLE="launcher", OMPI_MCA_orte_default_hostfile=str(hostfile),
               HOSTNAME=hostname,
               MNP_DRY_RUN="json", PATH=os.environ["PATH"], PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-m", "entrypoint", *pod["containers"][0]["args"]],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60,
                          check=False)
    return json.loads(proc.stdout)


def test_the_launcher_plans_efa_for_the_ranks_without_checking_efa_on_itself(tmp_path):
    plan = launcher_plan(tmp_path)
    assert (plan["role"]["scheduler"], plan["role"]["mode"]) == ("mpijob", "launcher")
    assert plan["fabric"]["kind"] == "efa"  # what mpirun exports to the workers' ranks
    assert plan["preflight"] == []  # the workers check EFA, where the devices are
    assert plan["role"]["node"]["runs_ranks"] is False
    assert plan["fabric"]["why"] == "MNP_FABRIC=efa, for the ranks on the other nodes (none runs here)"
    assert any(note.startswith("no rank runs on this node (mpijob)") for note in plan["notes"])


def test_a_launcher_that_is_also_a_worker_checks_efa_on_itself(tmp_path):
    """runLauncherAsWorker lists the launcher first in the hostfile: it runs ranks too."""
    plan = launcher_plan(tmp_path, hostname="mnp-launcher",
                         hosts="mnp-launcher.mnp slots=8\nmnp-worker-0.mnp slots=8\n")
    assert plan["role"]["node"]["runs_ranks"] is True
    assert [check["kind"] for check in plan["preflight"]][:1] == ["provider"]

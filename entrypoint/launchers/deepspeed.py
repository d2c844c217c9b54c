"""The DeepSpeed launcher unit: SSH, its runner (pdsh or openmpi) reaches children, an env file for ranks.

Main node only: ``deepspeed --hostfile <file> --launcher <pdsh|openmpi> --master_addr <first node>
--master_port <port> [--launcher_args ...] <program>``; pdsh when installed, else openmpi, or
``MNP_DEEPSPEED_LAUNCHER``. The exported variables reach every node through ``DS_ENV_FILE``
(DeepSpeed >= 0.10.1), else ``~/.deepspeed_env``.

Where a scheduler names the hosts (an MPIJob launcher: the operator's hostfile; a Slurm batch
script: the allocation) the entrypoint writes no Open MPI hostfile, and DeepSpeed without
``--hostfile`` reads ``/job/hostfile``, finds none and trains on this node alone. So the unit writes
DeepSpeed's own hostfile (``host slots=N``) from the scheduler's hosts as a plan file and passes it.
"""

import os
import re
import shlex
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from ..core import versions
from ..probe.facts import NodeFacts
from . import mca
from .base import Launch, LaunchRequest, Unit, program_tail

DS_ENV_FILE_MIN = ">=0.10.1"  # DeepSpeed PR #4006 (merged 2023-07-20): DS_ENV_FILE
# DeepSpeed PR #1957 (merged 2022-05-17, first in 0.6.5: determined-ai/determined PR #4156 of
# the same day says DeepSpeed "> 0.6.4" needs it and tests 0.6.5.dev): --no_ssh_check. The runner checks
# `ssh <first host> hostname` for any hostfile before it knows the job has one node; a single
# container runs no sshd, so without the flag a one-node job stops there.
NO_SSH_CHECK_MIN = ">=0.6.5"
SOURCE = ("https://github.com/deepspeedai/DeepSpeed/pull/4006 (DS_ENV_FILE, merged "
          "2023-07-20, in 0.10.1); PR #117 (~/.deepspeed_env, 2020); PR #1957 (--no_ssh_check, "
          "merged 2022-05-17); deepspeed/launcher/runner.py (pdsh default, openmpi runner)")
# DeepSpeed's runners write each env-file line as ``export NAME=VALUE`` for pdsh's remote shell
# (unquoted before DeepSpeed PR #5878, double-quoted after): only values that need no quoting in
# either form go through the file; the plan names the others.
SAFE_VALUE = re.compile(r"^[A-Za-z0-9_@%+=:,./^-]*$")
HOSTFILE = "deepspeed_hostfile"  # under MNP_STATE_DIR, where the scheduler names the hosts
# DeepSpeed's runner reads this path when no --hostfile is given (deepspeed/launcher/runner.py,
# DLTS_HOSTFILE): under a scheduler it does not exist, and the job runs on one node.
DEFAULT_HOSTFILE = "/job/hostfile"


class DeepSpeed(Unit):
    name = "deepspeed"
    order = 20
    needs_ssh = True
    on_children = "nothing to start: DeepSpeed's runner (pdsh or mpirun) reaches this node over SSH"
    env_propagation = "DS_ENV_FILE (DeepSpeed >= 0.10.1) or ~/.deepspeed_env"
    binary = "deepspeed"
    source = SOURCE
    reaches_hosts = True
    programs = ("deepspeed",)
    modules = ("deepspeed.launcher.runner",)
    options = ("MNP_DEEPSPEED_LAUNCHER",)

    def uses_mpi(self, facts: NodeFacts, options: Mapping[str, Any], rendezvous: bool) -> bool:
        return runner(options, facts)[0] == "openmpi"

    def mpi_findings(self, params: Sequence[Any]) -> Tuple[List[str], List[str]]:
        return mca.runner_conflicts(params)

    def launch(self, request: LaunchRequest) -> Launch:
        facts = request.facts
        chosen, why = runner(request.options, facts)
        launch = Launch([])
        launch.info.update(runner=chosen, runner_why=why)
        launch.problems.extend(missing_programs(chosen, facts))
        args = list(request.launcher_args)
        if chosen == "openmpi":
            # the MPI parameters are OMPI_MCA_* variables (launchers.mpi): none on this line, so
            # none can clash with the two the runner puts on its own
            args = (["--allow-run-as-root"] if facts.is_root else []) + args
        _env_file(launch, request)
        hostfile = _scheduler_hostfile(launch, request) or request.hostfile
        prefix = ["deepspeed"] if facts.binaries.get("deepspeed") else [
            "python3", "-m", "deepspeed.launcher.runner"]
        # the runner's own `ssh <first host> hostname` check reads none of the job's SSH
        # settings: skipped on one node and where the entrypoints wired a scheduler's nodes
        wired = request.node is not None and request.node.wired_because
        extra = (no_ssh_check(facts.versions.get("deepspeed"))
                 if request.mode == "single" or wired else _operator_ssh(launch, request, chosen))
        address, port = request.master
        launch.argv = command_line(prefix, request.command, hostfile, chosen, address,
                                   port, " ".join(shlex.quote(a) for a in args),
                                   extra)
        return launch


UNIT = DeepSpeed()


def runner(options: Mapping[str, Any], facts: NodeFacts) -> Tuple[str, str]:
    """DeepSpeed's runner and why: ``MNP_DEEPSPEED_LAUNCHER`` (in the unit's ``options``), else
    pdsh when installed, else openmpi."""
    given = options.get("MNP_DEEPSPEED_LAUNCHER")
    chosen = given or ("pdsh" if facts.binaries.get("pdsh") else "openmpi")
    why = ("MNP_DEEPSPEED_LAUNCHER" if given else
           "pdsh is installed" if chosen == "pdsh" else "pdsh is not installed")
    return chosen, why


def missing_programs(chosen: str, facts: Any) -> List[str]:
    bins = facts.binaries
    problems = []
    if chosen == "pdsh" and not bins.get("pdsh"):
        problems.append("pdsh not found on PATH but DeepSpeed's pdsh runner was asked for")
    if chosen == "openmpi" and not bins.get("mpirun"):
        problems.append("mpirun not found on PATH for DeepSpeed's openmpi runner")
    if not bins.get("deepspeed") and not facts.versions.get("deepspeed"):
        problems.append("deepspeed not found on PATH: install DeepSpeed or set MNP_LAUNCHER")
    return problems


def _env_file(launch: Launch, request: LaunchRequest) -> None:
    """The exported variables in DeepSpeed's env file, so its runner passes them to every node."""
    facts, env = request.facts, request.environment
    target, via = env_target(facts.versions.get("deepspeed"), request.state_dir,
                             facts.home, request.user_env)
    launch.info["env_propagation"] = via
    if not target:
        return
    unsafe = [name for name in request.exports if not SAFE_VALUE.match(env[name])]
    if unsafe:
        launch.notes.append("not in DeepSpeed's env file (the value would need shell quoting in "
                            "pdsh's remote command): %s" % ", ".join(unsafe))
    lines = "".join("%s=%s\n" % (name, env[name]) for name in request.exports
                    if name not in unsafe)
    launch.files.append({"path": target, "content": lines,
                         "why": "variables DeepSpeed exports to every node (%s)" % via})
    if via == "DS_ENV_FILE":
        launch.environment["DS_ENV_FILE"] = (target, "DeepSpeed reads the exported variables "
                                             "from this file", SOURCE)




def _scheduler_hostfile(launch: Launch, request: LaunchRequest) -> str:
    """DeepSpeed's hostfile from the scheduler's hosts (the node table) where the entrypoint
    writes no hostfile of its own, as a plan file; "" where it does (Batch, a single node).
    Slots: the scheduler's per host where they count processes (the MPI operator's
    ``slots=<slotsPerWorker>``); where they count Slurm tasks (a batch script's allocation often
    has one task per node for DeepSpeed) this node's devices, ``MNP_SLOTS_PER_NODE`` or detected:
    DeepSpeed starts one process per slot."""
    if request.hostfile or request.mode != "launcher":
        return ""
    node = request.node
    tasks = node is not None and node.slots_are == "tasks"
    rows = sorted(request.table, key=lambda n: n.index)
    path = os.path.join(request.state_dir, HOSTFILE)
    content = "".join("%s slots=%d\n" % (n.address, request.slots if tasks else n.slots)
                      for n in rows)
    source = ("this node's devices (%d), not the scheduler's tasks per node" % request.slots
              if tasks else "the scheduler's slots per host")
    launch.files.append({"path": path, "content": content,
                         "why": "DeepSpeed's hostfile: the scheduler's %d host(s), slots from %s "
                                "(without it DeepSpeed reads %s and runs on one node)"
                                % (len(rows), source, DEFAULT_HOSTFILE)})
    launch.info["hostfile"] = path
    if any(n.address.startswith("<") for n in rows):
        launch.notes.append("DeepSpeed's hostfile has placeholders here: the scheduler's host "
                            "list is read where the job runs")
    return path


def _operator_ssh(launch: Launch, request: LaunchRequest, chosen: str) -> List[str]:
    """Where the scheduler's launcher reaches its hosts with its own SSH (an MPIJob launcher:
    the operator's keys, host keys each worker makes at start): pdsh's ssh gets the same options
    (``PDSH_SSH_ARGS_APPEND``), and the runner's own ``ssh <first host> hostname`` check, which
    reads none of them, is skipped (``--no_ssh_check``, DeepSpeed >= 0.6.5)."""
    node = request.node
    if request.mode != "launcher" or node is None or node.launcher_ssh is None:
        return []
    ssh = node.launcher_ssh
    if chosen == "pdsh" and "PDSH_SSH_ARGS_APPEND" not in request.user_env:
        launch.environment["PDSH_SSH_ARGS_APPEND"] = (ssh.options, ssh.reason, ssh.source)
    return no_ssh_check(request.facts.versions.get("deepspeed"))


def env_target(deepspeed_version: Optional[str], state_dir: str, home: str,
               user_env: Dict[str, str]) -> Tuple[Optional[str], str]:
    """``(path, via)``: where the exported variables go so DeepSpeed passes them to every node."""
    if "DS_ENV_FILE" in user_env:
        return None, "DS_ENV_FILE set by the user: theirs is used"
    if versions.in_range(deepspeed_version, DS_ENV_FILE_MIN):
        return state_dir.rstrip("/") + "/deepspeed_env", "DS_ENV_FILE"
    return home.rstrip("/") + "/.deepspeed_env", "~/.deepspeed_env (DeepSpeed %s reads no "\
        "DS_ENV_FILE)" % (deepspeed_version or "of unknown version")


def no_ssh_check(deepspeed_version: Optional[str]) -> List[str]:
    """``--no_ssh_check`` where DeepSpeed has it: a single node's hostfile lists only this node,
    which the runner starts locally with no SSH once past its check; an MPIJob launcher's ssh
    needs the operator's options, and a Slurm step's the job's port and keys, which the check
    does not read (the user's home, often shared there, keeps its own ~/.ssh/config)."""
    if versions.in_range(deepspeed_version, NO_SSH_CHECK_MIN):
        return ["--no_ssh_check"]
    return []


def command_line(prefix: Sequence[str], command: Sequence[str], hostfile: str, launcher: str,
                 master_addr: str, master_port: int, launcher_args_text: str = "",
                 extra_args: Sequence[str] = ()) -> List[str]:
    """The deepspeed command line, run on the main node only."""
    line = list(prefix)
    if hostfile:
        line += ["--hostfile", hostfile]
    line += ["--launcher", launcher, "--master_addr", master_addr,
             "--master_port", str(master_port)]
    if launcher_args_text:
        # one token: a value that starts with "-" would be taken for an option by argparse
        line.append("--launcher_args=" + launcher_args_text)
    line += list(extra_args)
    tail, _kind = program_tail(command, "--module", ["--no_python", "--no_local_rank"])
    return line + tail

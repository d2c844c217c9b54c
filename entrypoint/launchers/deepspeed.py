"""The DeepSpeed launcher unit: SSH, its runner (pdsh or openmpi) reaches children, an env file for ranks.

Main node only: ``deepspeed --hostfile <file> --launcher <pdsh|openmpi> --master_addr <first node>
--master_port <port> [--launcher_args ...] <program>``; pdsh when installed, else openmpi, or
``MNP_DEEPSPEED_LAUNCHER``. The exported variables reach every node through ``DS_ENV_FILE``
(DeepSpeed >= 0.10.1), else ``~/.deepspeed_env``.
"""

from typing import Dict, List, Optional, Sequence, Tuple

from ..core import versions
from .base import Unit, split_program

DS_ENV_FILE_MIN = ">=0.10.1"  # DeepSpeed PR #4006 (merged 2023-07-20): DS_ENV_FILE
# DeepSpeed PR #1957 (merged 2022-05-17, first in 0.6.5: determined-ai/determined PR #4156 of
# the same day says DeepSpeed "> 0.6.4" needs it and tests 0.6.5.dev): --no_ssh_check. The runner checks
# `ssh <first host> hostname` for any hostfile before it knows the job has one node; a single
# container runs no sshd, so without the flag a one-node job stops there.
NO_SSH_CHECK_MIN = ">=0.6.5"
SOURCE = ("https://github.com/deepspeedai/DeepSpeed/pull/4006 (DS_ENV_FILE, merged "
          "2023-07-20, in 0.10.1); PR #117 (~/.deepspeed_env, 2020); PR #1957 (--no_ssh_check, "
          "merged 2022-05-17); deepspeed/launcher/runner.py (pdsh default, openmpi runner)")
UNIT = Unit("deepspeed", True, "nothing to start: DeepSpeed's runner (pdsh or "
            "mpirun) reaches this node over SSH",
            "DS_ENV_FILE (DeepSpeed >= 0.10.1) or ~/.deepspeed_env", "deepspeed", SOURCE)


def env_target(deepspeed_version: Optional[str], state_dir: str, home: str,
               user_env: Dict[str, str]) -> Tuple[Optional[str], str]:
    """``(path, via)``: where the exported variables go so DeepSpeed passes them to every node."""
    if "DS_ENV_FILE" in user_env:
        return None, "DS_ENV_FILE set by the user: theirs is used"
    if versions.in_range(deepspeed_version, DS_ENV_FILE_MIN):
        return state_dir.rstrip("/") + "/deepspeed_env", "DS_ENV_FILE"
    return home.rstrip("/") + "/.deepspeed_env", "~/.deepspeed_env (DeepSpeed %s reads no "\
        "DS_ENV_FILE)" % (deepspeed_version or "of unknown version")


def single_node_args(deepspeed_version: Optional[str]) -> List[str]:
    """Extra runner arguments for a single-node job: its hostfile lists only this node, which
    DeepSpeed's runner starts locally, with no SSH, once past its SSH check."""
    if versions.in_range(deepspeed_version, NO_SSH_CHECK_MIN):
        return ["--no_ssh_check"]
    return []


def argv(prefix: Sequence[str], command: Sequence[str], hostfile: str, launcher: str,
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
    kind, rest = split_program(command)
    if kind == "module":
        line += ["--module"] + rest
    elif kind == "script":
        line += rest
    else:
        line += ["--no_python", "--no_local_rank"] + rest
    return line

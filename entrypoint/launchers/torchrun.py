"""The torchrun launcher unit: no SSH; every node runs the same torchrun with its own ``--node_rank``.

``torchrun --nnodes N --node_rank R --nproc_per_node <slots> --master_addr <first node>
--master_port <port> <program>`` (``python3 -m torch.distributed.run`` when the ``torchrun``
script is missing). The underscore spellings work with every torch release; ``R`` is the node
index. ``--master_addr`` is the address of the first node in the hostfile (node index 0): rank 0
lives there, so its store must be there. On Batch that is normally the main node.

``torchrun`` on PyTorch older than 1.9 (no ``torch.distributed.run``) becomes
``torch.distributed.launch`` (``distributed_launch``), which PyTorch had since 1.0.
"""

from typing import Any, Dict, List, Optional, Sequence

from ..core import versions
from .base import Launch, LaunchRequest, Unit, program_tail

TORCHRUN_MIN = ">=1.9.0"  # torch.distributed.run (torchelastic) ships from PyTorch 1.9.0
SOURCE = ("https://pytorch.org/docs/1.9.0/elastic/run.html (torch.distributed.run, new in "
          "1.9.0); https://pytorch.org/docs/1.10.0/elastic/run.html (torchrun script)")
PET_SOURCE = ("torch/distributed/run.py and argparse_util.py (the options declared with the env "
              "or check_env action also read PET_<OPTION>: most of them, not --logs-specs or "
              "--numa-binding; https://github.com/pytorch/pytorch/blob/"
              "010929fd3f401c3868310396e6a91ed95aa0305b/torch/distributed/run.py)")
# torchrun (its main is decorated with torch.distributed.elastic's @record) copies the first
# failed worker's error record here, with that worker's exit code as errorCode, when the worker
# left one (torch/distributed/elastic/multiprocessing/errors/__init__.py, record;
# error_handler.py, dump_error_file): the final line reads it back (run.attribution).
ERROR_FILE_VARIABLE = "TORCHELASTIC_ERROR_FILE"
ERROR_FILE = "torchelastic_error.json"  # under MNP_STATE_DIR
ERROR_FILE_SOURCE = "https://pytorch.org/docs/stable/elastic/errors.html (TORCHELASTIC_ERROR_FILE)"


class Torchrun(Unit):
    name = "torchrun"
    order = 30
    on_children = "runs the same torchrun with --node_rank <index>"
    env_propagation = "none needed: every node starts its processes from its own environment"
    binary = "torchrun"
    source = SOURCE
    starts_without_ssh = True
    joins_elastic = True
    programs = ("torchrun",)
    modules = ("torch.distributed.run",)

    def prepare_environment(self, environment: Dict[str, str]) -> List[str]:
        return clear_pet(environment)

    def launch(self, request: LaunchRequest) -> Launch:
        prefix_ = prefix(request.facts.binaries)
        if request.elastic is not None:
            line = elastic_line(prefix_, request.elastic, request.slots)
        else:
            address, port = request.scheduler_master
            line = options(prefix_, len(request.table), request.node_index, request.slots,
                           address, port)
        tail, _kind = program_tail(request.command, "-m", ["--no_python"])
        launch = Launch(line + request.launcher_args + tail)
        error_file(launch, request)
        problem = pytorch_problem(self.name, request.facts)
        if problem:
            launch.problems.append(problem)
        return launch


UNIT = Torchrun()


def clear_pet(environment: Dict[str, str]) -> List[str]:
    """torchrun reads most options from ``PET_<OPTION>`` too (PET_SOURCE): when the entrypoint
    writes torchrun's command line, the scheduler's ``PET_*`` values leave the command's environment,
    so no option comes from two places (single-node flags plus an inherited
    ``PET_RDZV_ENDPOINT`` would join every node's world into one store)."""
    cleared = sorted(name for name in environment if name.startswith("PET_"))
    for name in cleared:
        del environment[name]
    if not cleared:
        return []
    return ["cleared %s: torchrun's command line carries what they say (%s)"
            % (", ".join(cleared), PET_SOURCE)]


def error_file(launch: Launch, request: LaunchRequest) -> None:
    """``TORCHELASTIC_ERROR_FILE`` for torchrun itself (its workers get their own from torchrun),
    unless the user set one: the first failure's record, which the final line reads back."""
    if ERROR_FILE_VARIABLE in request.user_env:
        return
    path = request.state_dir.rstrip("/") + "/" + ERROR_FILE
    launch.environment[ERROR_FILE_VARIABLE] = (
        path, "torchrun writes the first failed worker's error record here (with its exit "
        "code); the entrypoint's final line reads it", ERROR_FILE_SOURCE)


def fallback(pytorch_version: Optional[str]) -> Optional[str]:
    """The note when torchrun must become ``torch.distributed.launch`` (PyTorch < 1.9), else
    ``None``."""
    if versions.in_range(pytorch_version, TORCHRUN_MIN) is False:
        return ("PyTorch %s has no torch.distributed.run (new in 1.9.0): using "
                "torch.distributed.launch" % pytorch_version)
    return None


def pytorch_problem(unit_name: str, facts: Any) -> Optional[str]:
    """The plan problem when a PyTorch launcher is asked for on a node without PyTorch (no
    ``torch`` distribution and no ``torchrun`` script), else ``None``: both launchers run
    PyTorch's own modules (torch.distributed.run / torch.distributed.launch)."""
    if facts.versions.get("pytorch") or facts.binaries.get("torchrun"):
        return None
    return ("%s needs PyTorch, but neither the torch package nor a torchrun program was found: "
            "install PyTorch or set MNP_LAUNCHER" % unit_name)


def prefix(binaries: Dict[str, str]) -> List[str]:
    """``torchrun`` when the script is there, else ``python3 -m torch.distributed.run``."""
    if binaries.get("torchrun"):
        return ["torchrun"]
    return ["python3", "-m", "torch.distributed.run"]


def options(prefix: Sequence[str], nnodes: int, node_rank: int, nproc: int, master_addr: str,
            master_port: int) -> List[str]:
    """torchrun's options, the same on every node but for ``--node_rank``."""
    return list(prefix) + [
        "--nnodes", str(nnodes),
        "--node_rank", str(node_rank),
        "--nproc_per_node", str(nproc),
        "--master_addr", master_addr,
        "--master_port", str(master_port),
    ]


def elastic_line(prefix: Sequence[str], elastic: Any, nproc: int) -> List[str]:
    """torchrun's options for an elastic peer, from the scheduler's rendezvous facts."""
    line = list(prefix) + ["--nnodes", elastic.nnodes, "--nproc_per_node", str(nproc),
                           "--rdzv_backend", elastic.backend, "--rdzv_endpoint", elastic.endpoint]
    for value, flag in ((elastic.rdzv_id, "--rdzv_id"), (elastic.max_restarts, "--max_restarts"),
                        (elastic.conf, "--rdzv_conf")):
        if value is not None and value != "":
            line += [flag, str(value)]
    return line


def command_line(prefix: Sequence[str], command: Sequence[str], nnodes: int, node_rank: int,
                 nproc: int, master_addr: str, master_port: int,
                 launcher_args: Sequence[str] = ()) -> List[str]:
    """The torchrun command line, the same on every node but for ``--node_rank``."""
    tail, _kind = program_tail(command, "-m", ["--no_python"])
    return options(prefix, nnodes, node_rank, nproc, master_addr, master_port) + \
        list(launcher_args) + tail

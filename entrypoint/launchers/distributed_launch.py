"""The torch.distributed.launch unit (PyTorch 1.0+): no SSH; every node runs it with its own ``--node_rank``.

What ``torchrun`` becomes on PyTorch older than 1.9. It runs Python scripts and modules only; the
script receives ``--local_rank`` (add ``--use_env`` to MNP_LAUNCHER_ARGS for LOCAL_RANK).
"""

from typing import Dict, List

from . import torchrun
from .base import Launch, LaunchRequest, Unit, program_tail

SOURCE = ("https://pytorch.org/docs/1.4.0/distributed.html 'Launch "
          "utility' (--nnodes, --node_rank, --nproc_per_node, "
          "--master_addr, --master_port; passes --local_rank)")


class DistributedLaunch(Unit):
    name = "torch.distributed.launch"
    order = 40
    on_children = "runs the same python3 -m torch.distributed.launch with --node_rank <index>"
    env_propagation = "none needed: every node starts its processes from its own environment"
    binary = "python3"
    source = SOURCE
    starts_without_ssh = True
    modules = ("torch.distributed.launch",)

    def prepare_environment(self, environment: Dict[str, str]) -> List[str]:
        return torchrun.clear_pet(environment)

    def launch(self, request: LaunchRequest) -> Launch:
        address, port = request.scheduler_master
        line = ["python3", "-m", "torch.distributed.launch",
                "--nnodes", str(len(request.table)), "--node_rank", str(request.node_index),
                "--nproc_per_node", str(request.slots), "--master_addr", address,
                "--master_port", str(port)] + request.launcher_args
        tail, kind = program_tail(request.command, "-m", ())
        launch = Launch(line + tail)
        torchrun.error_file(launch, request)
        problem = torchrun.pytorch_problem(self.name, request.facts)
        if problem:
            launch.problems.append(problem)
        if kind == "exec":
            launch.problems.append("torch.distributed.launch runs Python scripts only; give the "
                                   "script (train.py ...) as the command")
        return launch


UNIT = DistributedLaunch()

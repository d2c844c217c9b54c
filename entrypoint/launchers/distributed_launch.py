"""The torch.distributed.launch unit (PyTorch 1.0+): no SSH; every node runs it with its own ``--node_rank``.

What ``torchrun`` becomes on PyTorch older than 1.9. It runs Python scripts and modules only; the
script receives ``--local_rank`` (add ``--use_env`` to MNP_LAUNCHER_ARGS for LOCAL_RANK).
"""

from typing import List, Optional, Sequence, Tuple

from .base import Unit, split_program

SOURCE = ("https://pytorch.org/docs/1.4.0/distributed.html 'Launch "
          "utility' (--nnodes, --node_rank, --nproc_per_node, "
          "--master_addr, --master_port; passes --local_rank)")
UNIT = Unit("torch.distributed.launch", False,
            "runs the same python3 -m torch.distributed.launch with --node_rank <index>",
            "none needed: every node starts its processes from its own environment", "python3",
            SOURCE)


def argv(command: Sequence[str], nnodes: int, node_rank: int, nproc: int, master_addr: str,
         master_port: int, launcher_args: Sequence[str] = ()
         ) -> Tuple[List[str], Optional[str]]:
    """``(argv, problem or None)``: ``python3 -m torch.distributed.launch ...``; a command that
    is not a Python script or module is a problem."""
    line = ["python3", "-m", "torch.distributed.launch",
            "--nnodes", str(nnodes), "--node_rank", str(node_rank),
            "--nproc_per_node", str(nproc), "--master_addr", master_addr,
            "--master_port", str(master_port)]
    line += list(launcher_args)
    kind, rest = split_program(command)
    if kind == "module":
        return line + ["-m"] + rest, None
    if kind == "script":
        return line + rest, None
    return line + rest, ("torch.distributed.launch runs Python scripts only; give the script "
                         "(train.py ...) as the command")

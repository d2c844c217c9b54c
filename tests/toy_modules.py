"""Toy extension modules the extension tests drop into a copy of the project: a scheduler
adapter (tests/entrypoint/test_ep_extension.py, tests/test_extension.py) and a launcher unit
(tests/test_extension.py, tests/publish/test_contract.py), one module each."""

TOY_SCHEDULER = '''"""A toy scheduler: TOY_RANK, TOY_SIZE and the main node at TOY_MAIN."""
from .base import STARTED, NodeTable, get, integer

NAME = "toy"
PRECEDENCE = 55
SUBMITTED = True
SOURCE = "tests/test_extension.py"
SIGNALS = ("TOY_RANK", "TOY_SIZE", "TOY_MAIN")
NODE_PREFIXES = ()  # per-process variable prefixes (base.ADAPTER_CONTRACT)


def detect(env):
    return "TOY_RANK" if get(env, "TOY_RANK") is not None else None


def trust(env):
    return STARTED, "only the toy scheduler sets TOY_RANK"


def table(env):
    rank = integer(env, "TOY_RANK")
    return NodeTable(NAME, "TOY_RANK", "main" if rank == 0 else "child", node_rank=rank,
                     num_nodes=integer(env, "TOY_SIZE"), main_address=get(env, "TOY_MAIN"),
                     rendezvous=integer(env, "TOY_SIZE") > 1)  # wired by us, as on Batch


def example(num_nodes, node_rank=0):
    return {"TOY_RANK": str(node_rank), "TOY_SIZE": str(num_nodes), "TOY_MAIN": "10.0.0.1"}
'''

TOY_UNIT = '''"""A toy launcher: one program, SSH to the other nodes."""
from .base import Launch, Unit


class Toy(Unit):
    name = "toy"
    needs_ssh = True
    source = "tests/toy_modules.py"
    programs = ("toyrun",)
    binary = "toyrun"

    def launch(self, request):
        return Launch(["toyrun", "-np", str(request.np)] + request.command)


UNIT = Toy()
'''

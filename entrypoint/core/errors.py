"""The entrypoint's failure classes, their exit codes, and the error kinds that carry them.

Every way a job can end is one of four classes, each with an exit code a scheduler's retry can
select (the table is ``CLASSES``; docs/entrypoint.md "Failure classes and exit codes" shows it):

- ``user``: the training command failed; its own exit status is passed through (1-255). Never
  retried: a bug fails the same way on every host.
- ``configuration``: the job as defined cannot start (an invalid ``MNP_*`` setting, no command, a
  program the launcher needs missing from the image, a secret the main node does not share, no
  EFA device on any node of an EFA job, a GPU driver older than the image's CUDA needs, which
  every host of the same AMI shares): ``CONFIGURATION_EXIT``. Never retried.
- ``infrastructure``: a host or the network failed (a node never joined in time, a peer was lost
  mid-run, a health check failed on a node, the NCCL network plugin did not load, the EFA
  preflight failed, no route to the main node, the main node's rendezvous server failed):
  ``INFRASTRUCTURE_EXIT``. Retried: another attempt runs on other hosts.
- ``signal``: the entrypoint was told to stop by signal N (Batch's SIGTERM, ``scancel``, a pod
  deletion): ``128 + N``, the shell's convention.

The codes are plain module constants so that job writers (``matrix.deploy``: Batch's
``retryStrategy``, the Slurm script's requeue, the Kubernetes restart policies) import them from
here and never repeat a number. No imports: every module can raise these errors.
"""

# -- the codes -------------------------------------------------------------------------------------
# The convention for a command used wrongly (POSIX utilities, bash's builtins, Python's argparse):
# the entrypoint's configuration errors have exited 2 since the first release.
CONFIGURATION_EXIT = 2
# Above every status a signal can give (128 + N, N <= SIGRTMAX = 64 on Linux: signal(7)), below
# 255 (ssh's own error status, which mpirun passes on): 200 cannot be read as a signal. In
# 128-255, which the Kubeflow training-operator's ``restartPolicy: ExitCode`` restarts
# (``IsRetryableExitCode``: exit code >= 128, SOURCES["pytorchjob"]), where 1-127 are permanent.
INFRASTRUCTURE_EXIT = 200
SIGNAL_BASE = 128  # 128 + N for signal N (bash(1) "EXIT STATUS")

USER = "user"
CONFIGURATION = "configuration"
INFRASTRUCTURE = "infrastructure"
SIGNAL = "signal"

SOURCES = {
    "pytorchjob": "kubeflow/training-operator v1.8.0 (commit "
                  "f8687ca7fd947e6ebd52dde4dfeefdf006e7b239) pkg/util/train/train_util.go "
                  "IsRetryableExitCode (exitCode >= 128), used by pkg/controller.v1/common/pod.go "
                  "under restartPolicy ExitCode: a failed pod with such a code is deleted and "
                  "created again, one with 1-127 fails the job (from v1.8.0 on: "
                  "https://github.com/kubeflow/trainer/pull/2071)",
    "batch": "https://docs.aws.amazon.com/batch/latest/APIReference/API_EvaluateOnExit.html "
             "(onExitCode: a glob on the decimal exit code; onStatusReason; action RETRY | EXIT) "
             "and https://docs.aws.amazon.com/batch/latest/userguide/job_retries.html",
    "kubernetes": "https://kubernetes.io/docs/concepts/workloads/controllers/job/"
                  "#pod-failure-policy (onExitCodes: In / NotIn a list of codes)",
    "slurm": "https://slurm.schedmd.com/scontrol.html (requeue) and "
             "https://slurm.schedmd.com/sbatch.html (--requeue, SLURM_RESTART_COUNT)",
    "signal": "bash(1) EXIT STATUS (128+N for a command ended by signal N); signal(7) (SIGRTMAX)",
}

# The table docs/entrypoint.md shows (tests/test_docs_entrypoint.py keeps the two equal).
CLASSES = (
    {"class": USER, "code": "the command's own status (1-255)", "retried": False,
     "when": "the training command (or its launcher) exited non-zero"},
    {"class": CONFIGURATION, "code": str(CONFIGURATION_EXIT), "retried": False,
     "when": "an invalid MNP_* setting, no command, a program the plan needs missing from the "
             "image, a child the main node rejects (another job, another secret), "
             "`MNP_FABRIC=efa` with no EFA device on any node of a wired (Batch) job, an NVIDIA "
             "driver older than the image's CUDA needs (the AMI's: every host of it has the same)"},
    {"class": INFRASTRUCTURE, "code": str(INFRASTRUCTURE_EXIT), "retried": True,
     "when": "a node never joined in time, a peer was lost mid-run, a health check failed on a "
             "node, the NCCL network plugin did not load, the EFA preflight failed, a node with "
             "no route or interface to its main node, `MNP_FABRIC=efa` with no EFA device on some "
             "nodes (or on a node whose job the entrypoint does not wire), a bug in the main "
             "node's rendezvous server"},
    {"class": SIGNAL, "code": "128+N (143 for SIGTERM)", "retried": False,
     "when": "the entrypoint was stopped by signal N (the scheduler ended the job)"},
)


def signal_exit(signum):
    """The exit status for signal ``signum`` (143 for SIGTERM)."""
    return SIGNAL_BASE + signum


def is_retryable(code):
    """True for the codes the generated retry rules retry: the infrastructure code only."""
    return code == INFRASTRUCTURE_EXIT


# -- the last line ---------------------------------------------------------------------------------
# The last line the entrypoint prints: ``exit <code> (<class> on node <node>[ <address>][, rank
# <rank>]): <reason>``, e.g. ``exit 7 (user on node 2 10.0.0.6, rank 5): ValueError: boom``.
# ``<node>`` is an index, several (``1,2``) or ``?``; the address and the rank are there when they
# are known (docs/entrypoint.md "The final line"). ``invoke run --attempts`` reads it back
# (``FINAL_LINE_PATTERN``).
FINAL_LINE_PATTERN = (r"exit (?P<code>\d+) \((?P<cls>user|configuration|infrastructure|signal|"
                      r"success) on node (?P<node>[^ ,)]+(?:,[^ ,)]+)*)(?: (?P<address>[^ ,)]+))?"
                      r"(?:, rank (?P<rank>\d+))?\): (?P<reason>.*)$")


def final_line(code, cls, node, reason, address=None, rank=None):
    """``exit 200 (infrastructure on node 2): ...``, ``exit 7 (user on node 2 10.0.0.6, rank 5):
    ValueError: boom`` (see ``FINAL_LINE_PATTERN``)."""
    where = "%s" % (node,)
    if address:
        where += " %s" % address
    if rank is not None:
        where += ", rank %d" % rank
    return "exit %d (%s on node %s): %s" % (code, cls, where, reason)


# -- the error kinds -------------------------------------------------------------------------------
class JobFailure(Exception):
    """A failure of the job in a known class; ``node`` is where it happened (``None``: here)."""

    failure_class = CONFIGURATION
    exit_code = CONFIGURATION_EXIT

    def __init__(self, message, node=None):
        Exception.__init__(self, message)
        self.node = node


class UsageError(JobFailure):
    """A usage problem, e.g. no command (configuration, exit 2)."""


class StartupError(JobFailure):
    """The job as defined cannot start: a program missing from the image, an unusable
    ``MNP_STATE_DIR`` (configuration, exit 2)."""


class InfrastructureError(StartupError):
    """A host or the network failed: a node never joined, a peer was lost, a health check or
    the EFA preflight failed (infrastructure, exit ``INFRASTRUCTURE_EXIT``, retried)."""

    failure_class = INFRASTRUCTURE
    exit_code = INFRASTRUCTURE_EXIT


class ConfigError(JobFailure):
    """An invalid setting; ``variable`` names it, ``str(self)`` is the full one-line message."""

    def __init__(self, variable, message):
        JobFailure.__init__(self, "%s: %s" % (variable, message))
        self.variable = variable

"""How a run ended: its exit code, its failure class (``core.errors``), the node and the reason.

Every path of the run ends in one ``Outcome``; ``main`` logs it as the entrypoint's last line
(``errors.final_line``) and exits with its code, so a scheduler's retry rule (Batch's
``evaluateOnExit``, the Slurm script's requeue, Kubernetes' restart policy) can tell a lost node
from a bug, and a person reading the log finds the class, the node and the reason in one place.
"""

import signal

from ..core import errors

# A child node that reports one of these was stopped from outside (its host went away, the
# scheduler stopped it): for the job that is a lost peer, not the user's command failing.
STOPPED_BY = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGKILL)


class Outcome(object):
    """``code`` (the exit status), ``cls`` (``errors.USER`` ... or ``"success"``), ``node`` (the
    node it concerns: an index, or ``"?"`` before the role is known) and ``reason``; where known,
    the node's ``address``, the failed ``rank`` and ``local_rank``, and ``at``, the wall-clock
    time the failure was first seen (to order failures across nodes)."""

    def __init__(self, code, cls, node, reason, address=None, rank=None, local_rank=None,
                 at=None):
        self.code = code
        self.cls = cls
        self.node = node
        self.reason = reason
        self.address = address
        self.rank = rank
        self.local_rank = local_rank
        self.at = at
        self.error = None  # the failed rank's exception line, where one was seen
        self.cause = None  # a start-up finding the main node weighs across nodes (``gate``)

    @property
    def ok(self):
        return self.code == 0

    def line(self):
        return errors.final_line(self.code, self.cls, self.node, self.reason, self.address,
                                 self.rank)

    def __repr__(self):
        return "Outcome(%r)" % self.line()


def success(node, reason="the command succeeded"):
    return Outcome(0, "success", node, reason)


def infrastructure(node, reason, address=None):
    return Outcome(errors.INFRASTRUCTURE_EXIT, errors.INFRASTRUCTURE, node,
                   reason + "; retryable on other hosts", address)


def configuration(node, reason):
    return Outcome(errors.CONFIGURATION_EXIT, errors.CONFIGURATION, node,
                   reason + "; not retried: fix the job")


# Who sends SIGTERM to a job's containers, by scheduler: what the line says it may have been.
TERM_SENDERS = {
    "batch": "AWS Batch stops a job's containers so when the job is cancelled or terminated",
    "slurm": "scancel, or the job's time limit",
    "pytorchjob": "the pod was deleted", "trainjob": "the pod was deleted",
    "mpijob": "the pod was deleted",
}


def signal_name(signum):
    try:
        return signal.Signals(signum).name
    except ValueError:
        return "signal %d" % signum


def stopped(node, signum, scheduler=None, others=False):
    """The entrypoint was told to stop by ``signum`` (Ctrl-C, the scheduler): 128+N, and a line
    that names the signal and says the job was interrupted; ``others``: this node told the other
    nodes to stop."""
    sender = TERM_SENDERS.get(scheduler) if signum == signal.SIGTERM else None
    return Outcome(errors.signal_exit(signum), errors.SIGNAL, node, "interrupted by %s (signal "
                   "%d%s)%s" % (signal_name(signum), signum, ": %s" % sender if sender else
                                ", Ctrl-C" if signum == signal.SIGINT else "",
                                "; the other nodes were told to stop" if others else ""))


def of_error(exc, node):
    """The outcome of a ``JobFailure`` raised on ``node`` (or on the node the error names)."""
    where = exc.node if getattr(exc, "node", None) is not None else node
    if getattr(exc, "failure_class", None) == errors.INFRASTRUCTURE:
        return infrastructure(where, str(exc))
    return configuration(where, str(exc))


def of_command(code, node, what="the command", address=None):
    """The outcome of the user's command (or its launcher) ending with ``code`` on ``node``."""
    if code == 0:
        return success(node)
    if code == errors.INFRASTRUCTURE_EXIT:
        return Outcome(code, errors.USER, node, "%s exited with %d, the infrastructure code: a "
                       "retry rule retries it (avoid this status in your program)" % (what, code),
                       address)
    if code > errors.SIGNAL_BASE and code - errors.SIGNAL_BASE < 65:
        sig = code - errors.SIGNAL_BASE
        return Outcome(code, errors.USER, node, "%s was killed by %s (signal %d, exit %d); not "
                       "retried" % (what, signal_name(sig), sig, code), address)
    return Outcome(code, errors.USER, node, "%s exited with %d; not retried" % (what, code),
                   address)


def of_failure(failure, node, address=None, who=None):
    """The outcome of the user's command failing as ``failure`` (an ``attribution.Failure``)
    says: the rank, its node and address, its exit status, its exception line. ``node`` and
    ``address`` are where it was seen, unless the failure names another node (mpirun's ranks
    run on every node; ``failure.node``)."""
    if failure.node is not None and failure.node != node:
        node, address = failure.node, failure.address
    if failure.rank is not None:
        who = "rank %d" % failure.rank
    ended = of_command(failure.code, node, who or "the command", address)
    if failure.error and failure.code != errors.INFRASTRUCTURE_EXIT:
        ended.reason = failure.error
    ended.rank, ended.local_rank, ended.at = failure.rank, failure.local_rank, failure.at
    ended.error = failure.error
    return ended


def of_child(index, code, failure=None, address=None):
    """What a child node's reported exit status means for the job; ``failure``: what the child
    reported of its ranks' failure (``attribution.Failure``), when its command failed."""
    if failure is not None and code not in (0, errors.INFRASTRUCTURE_EXIT,
                                            errors.CONFIGURATION_EXIT):
        return of_failure(failure, index, address, "the command on node %d" % index)
    if code == errors.INFRASTRUCTURE_EXIT:
        return infrastructure(index, "node %d failed (a start-up check or its link; its log "
                              "names what)" % index, address)
    if code == errors.CONFIGURATION_EXIT:
        return configuration(index, "node %d could not start (its log says why)" % index)
    if code - errors.SIGNAL_BASE in STOPPED_BY:
        return infrastructure(index, "node %d was stopped by signal %d (its host went away or "
                              "the scheduler stopped it)" % (index, code - errors.SIGNAL_BASE),
                              address)
    return of_command(code, index, "the command on node %d" % index, address)


def earliest(outcomes):
    """Of several failures, the one seen first (``at``); those without a time come last, in
    the order given."""
    found = [o for o in outcomes if o is not None]
    if not found:
        return None
    return min(found, key=lambda o: (o.at is None, o.at or 0.0, found.index(o)))

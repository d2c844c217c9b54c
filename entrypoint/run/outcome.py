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
    node it concerns: an index, or ``"?"`` before the role is known) and ``reason``."""

    def __init__(self, code, cls, node, reason):
        self.code = code
        self.cls = cls
        self.node = node
        self.reason = reason
        self.cause = None  # a start-up finding the main node weighs across nodes (``gate``)

    @property
    def ok(self):
        return self.code == 0

    def line(self):
        return errors.final_line(self.code, self.cls, self.node, self.reason)

    def __repr__(self):
        return "Outcome(%r)" % self.line()


def success(node, reason="the command succeeded"):
    return Outcome(0, "success", node, reason)


def infrastructure(node, reason):
    return Outcome(errors.INFRASTRUCTURE_EXIT, errors.INFRASTRUCTURE, node,
                   reason + "; retryable on other hosts")


def configuration(node, reason):
    return Outcome(errors.CONFIGURATION_EXIT, errors.CONFIGURATION, node,
                   reason + "; not retried: fix the job")


def stopped(node, signum, what="the entrypoint"):
    return Outcome(errors.signal_exit(signum), errors.SIGNAL, node,
                   "%s was stopped by signal %d" % (what, signum))


def of_error(exc, node):
    """The outcome of a ``JobFailure`` raised on ``node`` (or on the node the error names)."""
    where = exc.node if getattr(exc, "node", None) is not None else node
    if getattr(exc, "failure_class", None) == errors.INFRASTRUCTURE:
        return infrastructure(where, str(exc))
    return configuration(where, str(exc))


def of_command(code, node, what="the command"):
    """The outcome of the user's command (or its launcher) ending with ``code`` on ``node``."""
    if code == 0:
        return success(node)
    if code == errors.INFRASTRUCTURE_EXIT:
        return Outcome(code, errors.USER, node, "%s exited with %d, the infrastructure code: a "
                       "retry rule retries it (avoid this status in your program)" % (what, code))
    if code > errors.SIGNAL_BASE and code - errors.SIGNAL_BASE < 65:
        return Outcome(code, errors.USER, node, "%s was killed by signal %d (exit %d); not "
                       "retried" % (what, code - errors.SIGNAL_BASE, code))
    return Outcome(code, errors.USER, node, "%s exited with %d; not retried" % (what, code))


def of_child(index, code):
    """What a child node's reported exit status means for the job."""
    if code == errors.INFRASTRUCTURE_EXIT:
        return infrastructure(index, "node %d failed (a start-up check or its link; its log "
                              "names what)" % index)
    if code == errors.CONFIGURATION_EXIT:
        return configuration(index, "node %d could not start (its log says why)" % index)
    if code - errors.SIGNAL_BASE in STOPPED_BY:
        return infrastructure(index, "node %d was stopped by signal %d (its host went away or "
                              "the scheduler stopped it)" % (index, code - errors.SIGNAL_BASE))
    return of_command(code, index, "the command on node %d" % index)

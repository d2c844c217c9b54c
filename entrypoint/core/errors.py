"""The entrypoint's error kinds; ``main`` turns each into one line and an exit code. No imports:
every module (``config``, the scheduler adapters) can raise them."""


class UsageError(Exception):
    """A usage problem (exit 2), e.g. no command."""


class StartupError(Exception):
    """Something the job needs is missing or broken (exit 1)."""


class ConfigError(Exception):
    """An invalid setting; ``variable`` names it, ``str(self)`` is the full one-line message."""

    def __init__(self, variable, message):
        Exception.__init__(self, "%s: %s" % (variable, message))
        self.variable = variable

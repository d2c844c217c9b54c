"""The entrypoint's two run-time error kinds (``main`` turns them into one line and an exit code)."""


class UsageError(Exception):
    """A usage problem (exit 2), e.g. no command."""


class StartupError(Exception):
    """Something the job needs is missing or broken (exit 1)."""

"""Errors the CLI reports as one clear line instead of a traceback."""


class UserError(Exception):
    """A problem with the user's input or environment, printed as one line; exit status 1."""

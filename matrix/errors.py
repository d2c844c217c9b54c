"""Errors the CLI reports as one clear line instead of a traceback."""


class UserError(Exception):
    """A problem with the user's input or environment, printed as one line; exit status 1.

    The message is kept to one line whatever it quotes (a YAML key may hold a newline).
    """

    def __init__(self, message: str) -> None:
        super().__init__(str(message).replace("\r", "\\r").replace("\n", "\\n"))

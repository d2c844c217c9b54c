"""``python3 -m entrypoint CMD ARGS...``: see ``entrypoint.main``."""

import sys

from .run.main import main

if __name__ == "__main__":
    sys.exit(main())

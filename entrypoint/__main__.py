"""``python3 -m entrypoint CMD ARGS...``: see ``entrypoint.main``."""

import sys

try:
    from .run.main import main
except Exception as exc:  # noqa: BLE001 - the image's own entrypoint cannot load (a broken
    # adapter, a missing module): every host of the job fails alike, so this is configuration
    # (exit 2, never retried elsewhere), said in one line rather than a traceback.
    sys.stderr.write("mnp-entrypoint: exit 2 (configuration): the image's entrypoint cannot "
                     "start: %s: %s; rebuild the image\n" % (type(exc).__name__, exc))
    sys.exit(2)

if __name__ == "__main__":
    sys.exit(main())

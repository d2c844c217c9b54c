"""Version strings as release tuples and ``>=a,<b`` ranges, for the rows and units that depend
on an installed version (``1.18.0amzn1.0`` counts as 1.18.0)."""

import re

_RELEASE = re.compile(r"^v?(\d+(?:\.\d+)*)")
_BOUND = re.compile(r"^(>=|<=|==|<|>)\s*([0-9][0-9.]*)$")


def release(version):
    """The numeric release of a version string as a tuple: ``1.18.0amzn1.0`` -> (1, 18, 0)."""
    if version is None:
        return None
    match = _RELEASE.match(str(version).strip())
    if not match:
        return None
    return tuple(int(part) for part in match.group(1).split("."))


def _pad(a, b):
    width = max(len(a), len(b))
    return a + (0,) * (width - len(a)), b + (0,) * (width - len(b))


def in_range(version, spec):
    """Whether ``version`` (a string) satisfies ``spec`` (``">=1.6.0,<1.7.0"``); ``None`` if the
    version is unknown."""
    have = release(version)
    if have is None:
        return None
    for part in spec.split(","):
        match = _BOUND.match(part.strip())
        if not match:
            raise ValueError("bad version range %r" % spec)
        op, bound = match.group(1), release(match.group(2))
        left, right = _pad(have, bound)
        ok = {">=": left >= right, "<=": left <= right, "==": left == right,
              "<": left < right, ">": left > right}[op]
        if not ok:
            return False
    return True

"""Image references as Docker defines them: ``[host[:port]/]path[:tag][@digest]``.

The grammar is distribution/reference's, the package the Docker engine parses every image
name with (regexp.go, lines 41-136 at commit 727f80d:
https://github.com/distribution/reference/blob/727f80d42224f6696b8e1ad16b06aadf2c6b833b/regexp.go#L41-L136).
Each production below is one of its constants, built the same way, so a base that lives in a
registry with a port (``127.0.0.1:5000/team/cuda:12.8``) is accepted exactly when the engine
would accept it. The name's 255-character limit is its reference.go's ``NameTotalLengthMax``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# Primitives (regexp.go's const block).
_ALPHANUMERIC = r"[a-z0-9]+"
_SEPARATOR = r"(?:[._]|__|[-]+)"
_DOMAIN_NAME_COMPONENT = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_OPTIONAL_PORT = r"(?::[0-9]+)?"
TAG = r"[\w][\w.-]{0,127}"
DIGEST = r"[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*[:][0-9a-fA-F]{32,}"
_IPV6 = r"\[(?:[a-fA-F0-9:]+)\]"
_DOMAIN_NAME = _DOMAIN_NAME_COMPONENT + r"(?:\." + _DOMAIN_NAME_COMPONENT + r")*"
_HOST = f"(?:{_DOMAIN_NAME}|{_IPV6})"
DOMAIN_AND_PORT = _HOST + _OPTIONAL_PORT
# Composites (regexp.go's var block).
_PATH_COMPONENT = f"{_ALPHANUMERIC}(?:{_SEPARATOR}{_ALPHANUMERIC})*"
_REMOTE_NAME = f"{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*"
NAME = f"(?:{DOMAIN_AND_PORT}/)?{_REMOTE_NAME}"
# referencePat: anchored(capture(namePat), optional(":", capture(tag)), optional("@", capture(digest)))
# re.ASCII: Go's \w is [0-9A-Za-z_]; Python's, on str, is any Unicode word character.
REFERENCE = re.compile(f"^({NAME})(?::({TAG}))?(?:@({DIGEST}))?$", re.ASCII)
NAME_TOTAL_LENGTH_MAX = 255


@dataclass(frozen=True)
class Reference:
    """A parsed reference: ``domain`` is "" when the name has none (Docker Hub then)."""

    name: str
    tag: str
    digest: str

    @property
    def domain(self) -> str:
        """The registry host[:port], by the engine's rule: the first path part, when it has a
        ``.`` or a ``:`` or is ``localhost`` (distribution/reference normalize.go
        ``splitDockerDomain``); otherwise the name is Docker Hub's."""
        first, sep, _ = self.name.partition("/")
        if sep and ("." in first or ":" in first or first == "localhost"):
            return first
        return ""


def parse(text: str) -> Reference:
    """The reference ``text`` stands for; ValueError saying what is wrong when it is none."""
    match = REFERENCE.match(text)
    if not match:
        raise ValueError(f"{text!r} is not an image reference [host[:port]/]path[:tag][@digest] "
                         "(lower-case path components; Docker's reference grammar)")
    name, tag, digest = match.group(1), match.group(2) or "", match.group(3) or ""
    if len(name) > NAME_TOTAL_LENGTH_MAX:
        raise ValueError(f"image name is {len(name)} characters, over Docker's "
                         f"{NAME_TOTAL_LENGTH_MAX}")
    return Reference(name, tag, digest)

"""The image a job writer names when no ``--image-uri`` is given: a pushed digest of the stack's
image, as the local engine records it (``RepoDigests``), only where the job's hosts can pull it.

A digest the engine recorded for a registry on this machine's loopback (``127.0.0.1:5599/...``,
``localhost:5000/...``: a test push) names an image that exists only here: a Batch job, a Slurm
node or a pod pulling it would reach its own loopback. Such a digest is never the default; with
nothing better the writer asks for ``--image-uri``. A registry on a private address
(RFC 1918, IPv6 unique local, link-local) may be one the job's hosts reach (a registry inside the
VPC), or may not: it is the default only when no public one is recorded, and then the writer
says so. https://docs.python.org/3/library/ipaddress.html (``is_loopback``, ``is_global``)
classifies the addresses.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass

from matrix.errors import UserError

ASK = "pass --image-uri REPO@sha256:... (the digest `invoke push` printed for the job's registry)"


@dataclass(frozen=True)
class DefaultImageUri:
    """The digest reference to write, and ``note``: one line to print beside it ("" when the
    registry is a public one)."""

    uri: str
    note: str = ""


def registry_host(repo_digest: str) -> str:
    """The registry host[:port] of ``repo/path@sha256:...`` ("" for Docker Hub's short names)."""
    first, _, rest = repo_digest.split("@", 1)[0].partition("/")
    if rest and ("." in first or ":" in first or first == "localhost"):
        return first
    return ""


def _host_name(host: str) -> str:
    """``host`` without its port (``[::1]:5000`` -> ``::1``, ``127.0.0.1:5599`` -> ``127.0.0.1``)."""
    if host.startswith("["):
        return host[1:].split("]", 1)[0]
    return host.split(":", 1)[0] if host.count(":") == 1 else host


def reach(host: str) -> str:
    """``loopback``, ``private`` or ``public``: who can reach a registry at ``host``. A name is
    public (what it resolves to is the job's hosts' business) except ``localhost``; an address
    that is not globally routable (RFC 1918, unique local, link-local, shared) is private."""
    name = _host_name(host)
    if name == "localhost" or name.endswith(".localhost"):
        return "loopback"
    try:
        address = ipaddress.ip_address(name)
    except ValueError:
        return "public"
    if address.is_loopback or address.is_unspecified:
        return "loopback"
    return "public" if address.is_global else "private"


def default_image_uri(image: str, repo_digests: Sequence[str]) -> DefaultImageUri:
    """The digest reference of ``image`` (``repo:stack``) a writer may use without
    ``--image-uri``: the first of ``repo_digests`` on a public registry, else the first on a
    private-range one with a note saying so; a UserError asking for ``--image-uri`` when only
    loopback registries (or none) hold it."""
    ranked: dict[str, list[str]] = {"public": [], "private": [], "loopback": []}
    for digest in repo_digests:
        ranked[reach(registry_host(digest))].append(digest)
    if ranked["public"]:
        return DefaultImageUri(ranked["public"][0])
    if ranked["private"]:
        uri = ranked["private"][0]
        return DefaultImageUri(uri, f"the image is {uri}, pushed to {registry_host(uri)}, a "
                                    f"private-range registry: the job's hosts must reach it, "
                                    f"else {ASK}")
    if ranked["loopback"]:
        hosts = ", ".join(dict.fromkeys(registry_host(d) for d in ranked["loopback"]))
        raise UserError(f"no --image-uri given, and {image} was pushed only to a registry on "
                        f"this machine's loopback ({hosts}), which the job's hosts cannot pull "
                        f"from; {ASK}")
    raise UserError(f"no pushed digest for {image} in the local engine; push it first "
                    f"(`invoke push`) or {ASK}")

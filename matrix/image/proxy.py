"""Pass the user's HTTP proxy settings to the builds without storing them in an image.

Behind a corporate proxy, the downloads in a layer (apt, pip, curl) need ``http_proxy``,
``https_proxy`` and ``no_proxy``. They are taken from invoke's environment and given to each
build as build arguments under Docker's predefined proxy names, which every RUN sees as
environment variables without an ``ARG`` line and which the engine leaves out of the image's
history and configuration ("Predefined ARGs ... are excluded from the output of docker
history", https://docs.docker.com/reference/dockerfile/#predefined-args). They are not part of a
layer's content tag: the proxy changes how a layer is fetched, not what it holds.
"""

from __future__ import annotations

import os

# Docker's predefined proxy ARGs (same URL, section "Predefined ARGs"); both spellings, since
# tools differ in which one they read (curl: lower case http_proxy only; apt and pip: either).
PREDEFINED = ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy", "FTP_PROXY", "ftp_proxy",
              "NO_PROXY", "no_proxy")


def build_args(environ: dict[str, str] | None = None) -> dict[str, str]:
    """The proxy build arguments for the current environment (both spellings of each one set)."""
    env = os.environ if environ is None else environ
    args: dict[str, str] = {}
    for upper in PREDEFINED[::2]:
        lower = upper.lower()
        value = env.get(lower) or env.get(upper)
        if value:
            args[upper] = args[lower] = value
    return args

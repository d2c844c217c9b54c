"""The container of a build step that an engine fault cut off, and its removal.

The classic builder runs a RUN step (and a metadata step: LABEL, ENV, ...) in a container it
creates and announces (`` ---> Running in <id>``); with ``forcerm`` it removes that container when
the step ends, failed or not, and only then says ``Removing intermediate container <id>``
(``containerManager.RemoveAll``/``removeContainer`` in
https://github.com/moby/moby/blob/v20.10.24/builder/dockerfile/containerbackend.go). That removal
runs inside the daemon after the step's container has stopped. A dockerd that is killed (systemd's
SIGKILL once its stop timeout passes, the OOM killer), or whose shutdown under load ends before the
build's cleanup runs, never does it: the restarted engine restores the container, exited, and
nothing removes it. Seen on dockerd 20.10.24 with a second engine (tests/test_engine_restart.py).

So the builder follows the build's stream (:class:`Steps`): a container announced and not
reported removed belongs to the step the fault cut off. Once the engine answers again (waiting
up to :data:`WAIT_S` for a restart) it is removed; when the engine does not answer by then, or
the removal fails, a record under ``<state>/cut-off/<engine ID>/`` has the next build on that
engine remove it first (:func:`sweep`). Only that container is ever removed: it is found by the
ID the engine printed for the step, and must have been created from the image the step before it
made (``Config.Image``), as the builder creates a step's container (``updateRunConfig`` in
https://github.com/moby/moby/blob/v20.10.24/builder/dockerfile/builder.go) and a user's container
on an untagged intermediate image with the same ID prefix is not.
"""

from __future__ import annotations

import contextlib
import json
import re
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import docker
import requests
from docker.errors import APIError, NotFound

from matrix.image import engine
from matrix.model.settings import write_atomically

# A restarted dockerd answers within seconds; one that stays down costs the failing command no
# more than this, and the record covers the rest.
WAIT_S = 10.0
SHORT_ID = re.compile(r"^[0-9a-f]{12}$")  # what the classic builder prints for an ID
RUNNING = re.compile(r"^---> Running in ([0-9a-f]{12})$")
REMOVED = re.compile(r"^Removing intermediate container ([0-9a-f]{12})$")  # not "Error removing"
IMAGE = re.compile(r"^---> ([0-9a-f]{12})$")
REMOVED_NOW, ABSENT, REFUSED = "removed", "absent", "refused"  # what remove() found and did


@dataclass(frozen=True)
class CutOff:
    """A build step's container (short ID) and the image it was created from (short ID)."""

    container: str
    image: str
    layer: str


class Steps:
    """What one build's stream says about its step containers, line by line."""

    def __init__(self, layer: str) -> None:
        self.layer = layer
        self._image = ""  # the image the last finished step made: the next step's Config.Image
        self._open: CutOff | None = None

    def see(self, text: str) -> None:
        for line in text.splitlines():
            line = line.strip()
            running, removed, image = RUNNING.match(line), REMOVED.match(line), IMAGE.match(line)
            if running:
                self._open = CutOff(running[1], self._image, self.layer)
            elif removed and self._open and removed[1] == self._open.container:
                self._open = None
            elif image:
                self._image = image[1]

    def cut_off(self) -> CutOff | None:
        """The step container the engine announced and did not report removed (None: none)."""
        return self._open if self._open and self._open.image else None


def after_fault(client: docker.DockerClient, steps: Steps, state: Path, engine_key: str,
                fault: BaseException | None = None) -> str:
    """Remove the cut-off step's container once the engine answers again, or leave a record for
    the next build; what became of it, as a clause for the fault's one line ("" when none). A
    read that timed out is not a cut-off: the engine may still be running that step."""
    cut = steps.cut_off()
    if cut is None or isinstance(fault, requests.exceptions.Timeout):
        return ""
    outcome = REFUSED
    if _answers_within(client, WAIT_S):
        with contextlib.suppress(*engine.ENGINE_FAULTS):
            outcome = remove(client, cut)
    if outcome == REMOVED_NOW:
        return f"; removed the cut-off step's container {cut.container}"
    if outcome == ABSENT:
        return ""
    if _record(state, engine_key, cut):
        return f"; the next build removes the cut-off step's container {cut.container}"
    return f"; the cut-off step's container {cut.container} is left on the engine (`docker rm` it)"


def sweep(client: docker.DockerClient, state: Path, engine_key: str,
          say: Callable[[str], None]) -> None:
    """Remove the containers earlier builds on this engine recorded as cut off (see module)."""
    folder = _folder(state, engine_key)
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else ():
        try:
            cut = CutOff(**json.loads(path.read_text(encoding="utf-8")))
            if not (SHORT_ID.match(str(cut.container)) and SHORT_ID.match(str(cut.image))):
                raise ValueError("not two 12-digit IDs")
        except (OSError, ValueError, TypeError) as exc:
            say(f"ignored an unreadable record of a cut-off build step, {path}: {exc}")
            with contextlib.suppress(OSError):
                path.unlink(missing_ok=True)
            continue
        try:
            outcome = remove(client, cut)
        except engine.ENGINE_FAULTS:
            return  # the build's own next call to the engine says what is wrong with it
        if outcome != REFUSED:
            with contextlib.suppress(OSError):
                path.unlink(missing_ok=True)
        if outcome == REMOVED_NOW:
            say(f"removed container {cut.container}, left by a build step of {cut.layer} that "
                "the engine cut off")


def remove(client: docker.DockerClient, cut: CutOff) -> str:
    """Remove the step's container when it is still there and still the step's: REMOVED_NOW,
    ABSENT (nothing of the step's is there) or REFUSED (try again later). Engine faults
    propagate."""
    try:
        attrs = client.api.inspect_container(cut.container)
    except NotFound:
        return ABSENT
    created_from = str((attrs.get("Config") or {}).get("Image") or "").split(":")[-1]
    if not (attrs.get("Id", "").startswith(cut.container) and created_from.startswith(cut.image)):
        return ABSENT  # another container under that prefix: not the step's, not ours to remove
    try:
        client.api.remove_container(attrs["Id"], v=True, force=True)  # as the builder's own rm
    except NotFound:
        return ABSENT
    except APIError:
        return REFUSED  # e.g. 409, the daemon is removing it itself: look again next build
    return REMOVED_NOW


def _answers_within(client: docker.DockerClient, seconds: float) -> bool:
    probe = docker.APIClient(base_url=engine.where(client), version=client.api.api_version,
                             timeout=2)
    deadline = time.monotonic() + seconds
    try:
        while True:
            try:
                return bool(probe.ping())
            except engine.ENGINE_FAULTS:
                if time.monotonic() >= deadline:
                    return False
                time.sleep(0.5)
    finally:
        probe.close()


def _folder(state: Path, engine_key: str) -> Path:
    return state / "cut-off" / engine_key


def _record(state: Path, engine_key: str, cut: CutOff) -> bool:
    """Write the record whole or not at all (a temporary file renamed over); False when it
    cannot be written (the fault's line then says the container is left)."""
    try:
        write_atomically(_folder(state, engine_key) / f"{cut.container}.json",
                         json.dumps(asdict(cut)))
        return True
    except OSError:
        return False

#!/usr/bin/python3
"""pyxis and enroot, played without SPANK on the tests' Slurm cluster (``slurm_cluster.py``).

Neither pyxis nor enroot is packaged for Debian and their sources cannot be fetched here, so
this play does what they do to a job, read from their source. Every citation is ``file:line`` at
one of these commits (cited by their first 8 hex digits; "pyxis" is NVIDIA/pyxis, "enroot" is
NVIDIA/enroot, pyxis_slurmstepd.c is at 2ca2427d unless another commit is named):
    pyxis  2ca2427d4bd709627ce5e696c39fed4e143c7a48  pyxis_slurmstepd.c, config.c (2025)
    pyxis  2eb8b711d9b314cc438a2091b008b3f6f51af843  args.c (the index has none at 2ca2427d)
    enroot 2e3ce06592f69119c30467221a35c39b2c339f2a  src/, bin/, conf/hooks/extra/ (2021)
It is installed in every node container twice:

- as ``/usr/local/bin/srun``, before Slurm's ``/usr/bin/srun`` on PATH: it takes pyxis' options
  out of the command line (pyxis adds them to srun: pyxis args.c:46-161 at 2eb8b711) and runs
  the real ``srun`` with each task's command wrapped in ``pyxis-task``; a step without
  ``--container-image`` or ``--container-name`` is left alone, as pyxis leaves it (args.c:724-726
  at 2eb8b711, checked at pyxis_slurmstepd.c:273);
- as ``/usr/local/bin/pyxis-task``: what pyxis' ``slurm_spank_task_init``
  (pyxis_slurmstepd.c:1340-1441) does in each task before the task's command, then ``exec`` of
  that command.

What each task gets, as pyxis gives it:

1. The node's container is started once per step, by the first task to get there; the others
   wait for it (``enroot_start_once``, pyxis_slurmstepd.c:1283-1299, on a process-shared mutex
   in shared memory, :1000-1010). The start is ``enroot start --conf SCRIPT NAME sh -c "kill
   -STOP $$ ; exit 0"`` (:941-942). The script has no ``rc()`` and pyxis gives no ``--rc``, so
   enroot runs the image's ``/etc/rc`` with the words after NAME as its arguments (enroot
   src/runtime.sh:273, bin/enroot-switchroot.c:692-720 at 2e3ce065). enroot wrote that
   ``/etc/rc`` at import from the image config (src/docker.sh:204-226): ``cd WorkingDir``,
   source ``/etc/rc.local`` when not empty, ``exec ENTRYPOINT "$@"``. Unless
   ``--container-entrypoint`` is given or the site sets ``execute_entrypoint=1``
   (pyxis_slurmstepd.c:114; off by default, pyxis config.c:36), the script's ``hooks()`` writes
   ``exec "$@"`` into ``rc.local`` (pyxis_slurmstepd.c:850-859): the ENTRYPOINT never runs.
2. The start's environment is one file and nothing else (enroot bin/common.h:147-164 at
   2e3ce065: ``clearenv``, then each valid ``NAME=value`` line in order, later lines winning;
   loaded at bin/enroot-switchroot.c:772): the image's ``ENV`` (src/docker.sh:197, read at
   src/runtime.sh:41), the host's ``environ.d`` files (src/runtime.sh:44-50), the
   ``--container-env`` names that are set and not empty, with the job's values
   (pyxis_slurmstepd.c:868-875, read at src/runtime.sh:53-54), then whatever enroot's hooks
   append (src/runtime.sh:92-101, run after the environment at :248-250). Unless a hook adds
   them, no Slurm variable reaches an ENTRYPOINT run there; enroot's extra hook
   conf/hooks/extra/50-slurm-pmi.sh, where a site installs it, appends every ``SLURM_*`` of the
   enroot process (:24): the job's minus ``SLURM_PROCID``, ``SLURM_LOCALID`` and
   ``SLURM_TASK_PID`` (pyxis_slurmstepd.c:339-358). The play runs no hooks.
3. pyxis waits for that process to stop itself (``waitpid`` with ``WUNTRACED``,
   pyxis_slurmstepd.c:949): an exit with a non-zero status is "container start failed with
   error code" (:955-956), any other end "container exited too soon" (:960-961); a process that
   never stops is waited for forever. The play stops waiting after ``start_timeout`` seconds
   (the only thing here that pyxis does not do) and says so.
4. Each task's environment is the job's, minus ``LANG``, ``LANGUAGE`` and ``LC_ALL`` unless
   ``--container-env`` names them (pyxis_slurmstepd.c:584-611), with every variable of the
   stopped container process copied over it, except the names in ``--container-env``, which
   keep the job's value (:619-629). With ``PYTORCH_VERSION`` set, ``RANK`` and ``LOCAL_RANK`` are
   copied from ``SLURM_PROCID`` and ``SLURM_LOCALID`` (:1240, :1250-1252, :1268).
5. The task joins the container's user (unless privileged), cgroup and mount namespaces and no
   other (pyxis_slurmstepd.c:752-776, :1388-1408), then changes to ``--container-workdir`` or to
   the container process's working directory (:800, :1411-1423). The last task of the node to
   get there sends the stopped process ``SIGCONT`` (``enroot_stop_once``, :1322, :985); then the
   task's own command runs.

What the play cannot do: namespaces (the node container's root already is the image, so joining
is a ``chdir``; ``--container-mounts`` must name a path that exists at the same place on the
node), enroot's hooks (PMIx, PyTorch, NVIDIA), its ``environ.d`` files and its ``envsubst`` of
``/etc/environment`` (src/runtime.sh:41), image import (the image reference is parsed with
enroot's rule, then looked up in the images the test registered in ``IMAGES``),
``PYXIS_CONTAINER_*`` variables (args.c:177-252 at 2eb8b711, read at pyxis_slurmstepd.c:271),
``--container-unshare`` (args.c:155-160 at 2eb8b711; nothing at 2ca2427d uses it), named and
saved containers, and each container's own tmpfs on ``/var/run`` (NVIDIA/enroot
conf/mounts/10-system.fstab:5 at 102be94b): the nodes' ``/run`` is shared by the steps, so a
cluster that runs a user's jobs opens it to that user instead (``slurm_cluster.py`` user_run).
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shlex
import signal
import sys
import time

REAL_SRUN = "/usr/bin/srun"
TASK = "/usr/local/bin/pyxis-task"
# What the test registers: {"images": {enroot URI: docker image config}, "start_timeout": s}
IMAGES = "/etc/slurm/pyxis-play/images.json"
RUNTIME = "/run/pyxis-play"  # per node, like pyxis' runtime_path (/run/pyxis, config.c:35)
STOP_SELF = "kill -STOP $$ ; exit 0"  # pyxis_slurmstepd.c:942
# pyxis' options (args.c:46-161 at 2eb8b711): those that take a value, then the flags; the play
# leaves out --container-unshare (args.c:155-160), which pyxis_slurmstepd.c at 2ca2427d lacks
VALUED = ("container-image", "container-mounts", "container-workdir", "container-name",
          "container-save", "container-env")
FLAGS = ("container-mount-home", "no-container-mount-home", "container-remap-root",
         "no-container-remap-root", "container-entrypoint", "no-container-entrypoint",
         "container-entrypoint-log", "container-writable", "container-readonly")
# enroot's image reference (enroot src/docker.sh:243-249 at 2e3ce065, the same classes: its
# user class holds the range ',-@' and a backslash); pyxis prefixes docker://
# (pyxis_slurmstepd.c:664)
ENROOT_URI = re.compile(r"^docker://(([A-Za-z0-9_.!~*\\'()%;:&=+$,-@]+)@)?(([^#]+)#)?"
                        r"([a-z0-9/._-]+)(:([A-Za-z0-9._:-]+))?$")
# job variables pyxis does not hand to enroot (pyxis_slurmstepd.c:339-358)
ENROOT_DENY = ("PATH", "LD_LIBRARY_PATH", "LD_PRELOAD", "SLURM_PROCID", "SLURM_LOCALID",
               "SLURM_TASK_PID", "PMIX_RANK", "PMI_FD", "ENROOT_LIBRARY_PATH",
               "ENROOT_SYSCONF_PATH", "ENROOT_RUNTIME_PATH", "ENROOT_CACHE_PATH",
               "ENROOT_DATA_PATH", "ENROOT_TEMP_PATH", "ENROOT_ZSTD_OPTIONS",
               "ENROOT_TRANSFER_RETRIES", "ENROOT_CONNECT_TIMEOUT", "ENROOT_MAX_CONNECTIONS",
               "ENROOT_ALLOW_HTTP")
# job variables pyxis removes before importing the container's (pyxis_slurmstepd.c:584-589)
TASK_DENY = ("LANG", "LANGUAGE", "LC_ALL")
# a line of enroot's environment file that load_environment keeps (enroot bin/common.h:133-144)
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class PyxisError(Exception):
    """A task that pyxis fails: srun prints the line and the task exits 1."""


def fail(message: str) -> None:
    raise PyxisError(message)


# --- srun: pyxis' options out, pyxis-task in ---------------------------------------------------

def split_srun(argv: list[str]) -> tuple[list[str], dict[str, object], list[str]]:
    """``(srun options, pyxis options, command)``. srun's options end at the first word that is
    not an option; the generated scripts give every srun option as ``--name=value``."""
    srun, pyxis, index = [], {}, 0
    while index < len(argv) and argv[index].startswith("-") and argv[index] != "--":
        word = argv[index]
        name, has_value, value = word[2:].partition("=")
        if word.startswith("--") and name in VALUED:
            if not has_value:
                index += 1
                if index == len(argv):
                    fail(f"--{name}: argument required")
                value = argv[index]
            pyxis[name] = value
        elif word.startswith("--") and name in FLAGS:
            pyxis[name] = True
        elif word.startswith("--container") or word.startswith("--no-container"):
            print(f"srun: unrecognized option '{word}'", file=sys.stderr)
            sys.exit(1)
        else:
            srun.append(word)
        index += 1
    if index < len(argv) and argv[index] == "--":
        index += 1
    return srun, pyxis, argv[index:]


def task_options(pyxis: dict[str, object]) -> list[str]:
    return [f"--{name}={value}" if value is not True else f"--{name}"
            for name, value in pyxis.items()]


def srun_main(argv: list[str]) -> None:
    srun, pyxis, command = split_srun(argv)
    if not command or ("container-image" not in pyxis and "container-name" not in pyxis):
        # not a container step (args.c:724-726 at 2eb8b711)
        os.execv(REAL_SRUN, [REAL_SRUN, *argv])
    if "container-entrypoint" in pyxis and "no-container-entrypoint" in pyxis:  # args.c:598-603
        fail("both --container-entrypoint and --no-container-entrypoint were specified")
    os.execv(REAL_SRUN, [REAL_SRUN, *srun, TASK, *task_options(pyxis), "--", *command])


# --- the image, as enroot imports it ------------------------------------------------------------

def image_config(reference: str) -> dict:
    """The registered config of ``reference``; pyxis' import failure line (pyxis_slurmstepd.c:691)
    with enroot's own (enroot src/docker.sh:255) when enroot would refuse the reference."""
    uri = reference if "://" in reference else "docker://" + reference
    if not ENROOT_URI.match(uri):
        fail(f"failed to import docker image\npyxis:     [ERROR] Invalid image reference: {uri}")
    with open(IMAGES) as handle:
        registered = json.load(handle)["images"]
    if reference not in registered:
        fail(f"failed to import docker image: {reference} (the play knows "
             f"{', '.join(sorted(registered))})")
    return registered[reference]


def rc_script(config: dict, rc_local: str) -> str:
    """enroot's ``/etc/rc`` for ``config`` (enroot src/docker.sh:204-226 at 2e3ce065; labels,
    written there as comments, are left out)."""
    workdir = config.get("WorkingDir") or "/"
    entrypoint = " ".join(shlex.quote(word) for word in config.get("Entrypoint") or [])
    cmd = config.get("Cmd") or ([] if config.get("Entrypoint") else ["/bin/sh"])
    default = " ".join(shlex.quote(word) for word in cmd)
    return (f'mkdir -p "{workdir}" 2> /dev/null\n'
            f'cd "{workdir}" && unset OLDPWD || exit 1\n'
            f"if [ -s {shlex.quote(rc_local)} ]; then\n    . {shlex.quote(rc_local)}\nfi\n"
            f'if [ $# -gt 0 ]; then\n    exec {entrypoint} "$@"\n'
            f"else\n    exec {entrypoint} {default}\nfi\n")


def container_environment(config: dict, env_vars: list[str], job: dict[str, str]) -> dict:
    """The started container's environment: the image's ENV (enroot src/runtime.sh:41), then
    the ``--container-env`` names set and not empty in the job, with its values
    (pyxis_slurmstepd.c:868-875, enroot src/runtime.sh:53-54), as enroot bin/common.h:147-164
    loads that file: ``clearenv``, then each valid line in order, later lines winning."""
    enroot_env = {name: value for name, value in job.items() if name not in ENROOT_DENY}
    lines = list(config.get("Env") or [])
    lines += [f"{name}={enroot_env[name]}" for name in env_vars if enroot_env.get(name)]
    environment = {}
    for line in lines:
        name, has_value, value = line.partition("=")
        if has_value and ENV_NAME.match(name):
            environment[name] = value
    return environment


# --- the node's container, started once per step -------------------------------------------------

class Step:
    """This node's share of a step: a lock, counters and the container's state in RUNTIME."""

    def __init__(self, job: dict[str, str]) -> None:
        self.name = f"pyxis_{job.get('SLURM_JOB_ID', '0')}.{job.get('SLURM_STEP_ID', '0')}"
        # pyxis keeps this in the step's slurmstepd; a requeued job runs its steps again
        self.dir = os.path.join(RUNTIME, f"{self.name}.{job.get('SLURM_RESTART_COUNT', '0')}")
        os.makedirs(self.dir, exist_ok=True)
        self.lock_fd = os.open(os.path.join(self.dir, "lock"), os.O_CREAT | os.O_RDWR, 0o600)

    def path(self, name: str) -> str:
        return os.path.join(self.dir, name)

    def bump(self, counter: str) -> int:
        """Add one to ``counter``; its new value (callers hold the lock)."""
        try:
            with open(self.path(counter)) as handle:
                count = int(handle.read() or 0) + 1
        except FileNotFoundError:
            count = 1
        with open(self.path(counter), "w") as handle:
            handle.write(str(count))
        return count

    def __enter__(self) -> Step:
        fcntl.flock(self.lock_fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc: object) -> None:
        fcntl.flock(self.lock_fd, fcntl.LOCK_UN)


def write_state(step: Step, state: dict) -> None:
    temporary = step.path("state.tmp")
    with open(temporary, "w") as handle:
        json.dump(state, handle)
    os.replace(temporary, step.path("state"))


def log_text(step: Step) -> str:
    try:
        with open(step.path("enroot.log"), errors="replace") as handle:
            return handle.read()
    except FileNotFoundError:
        return ""


def launch_container(step: Step, argv: list[str], environment: dict, timeout: float) -> None:
    """In a process of its own (the play's slurmstepd): start the container like
    ``enroot_container_start`` (pyxis_slurmstepd.c:941-963), record how it went, then wait for
    its end so nothing is left."""
    log = os.open(step.path("enroot.log"), os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o600)
    pid = os.fork()
    # enroot start ...: stdin /dev/null, output to the log (pyxis enroot.c:39-58 at
    # 0b89e465d1a155ac4bf49358000dd83321d4af11; the index has no enroot.c at 2ca2427d)
    if pid == 0:
        os.setsid()
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.chdir("/")
        os.execve("/bin/sh", argv, environment)
    deadline = time.monotonic() + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG | os.WUNTRACED)
        if done:
            break
        if time.monotonic() > deadline:
            os.killpg(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            write_state(step, {"error": f"the container did not stop itself in {timeout:g}s; "
                                        "pyxis waits for it forever: the step hangs here"})
            return
        time.sleep(0.02)
    if os.WIFSTOPPED(status):
        write_state(step, {"pid": pid})
        os.waitpid(pid, 0)  # SIGCONT from the last task: the shell exits 0
    elif os.WIFEXITED(status) and os.WEXITSTATUS(status) != 0:
        write_state(step, {"error": "container start failed with error code: "
                                    f"{os.WEXITSTATUS(status)}"})
    else:
        write_state(step, {"error": "container exited too soon"})


def start_container(step: Step, config: dict, options: dict, job: dict[str, str]) -> None:
    """Fork the play's slurmstepd away from this task (so the task's ``exec`` leaves it no
    child), and let it start the container."""
    env_vars = options["env_vars"]
    rc_local = step.path("rc.local")
    # pyxis' hooks() unless the ENTRYPOINT is to run (pyxis_slurmstepd.c:850-859)
    with open(rc_local, "w") as handle:
        handle.write("# sourced by /etc/rc\n" if options["entrypoint"] else 'exec "$@"\n')
    with open(step.path("rc"), "w") as handle:
        handle.write(rc_script(config, rc_local))
    # /etc/rc with the command's words as its arguments (enroot src/runtime.sh:273,
    # bin/enroot-switchroot.c:692-720 at 2e3ce065; the play's shell is /bin/sh, not $SHELL)
    argv = ["sh", step.path("rc"), "sh", "-c", STOP_SELF]
    environment = container_environment(config, env_vars, job)
    print(f"pyxis: starting container: {step.name}", file=sys.stderr, flush=True)
    first = os.fork()
    if first:
        os.waitpid(first, 0)
        return
    os.setsid()
    if os.fork():
        os._exit(0)
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.close(step.lock_fd)  # the task's lock stays the task's
    try:
        launch_container(step, argv, environment, options["start_timeout"])
    except Exception as exc:  # noqa: BLE001 - every task waits for a state: give one
        write_state(step, {"error": f"the play's container start failed: {exc!r}"})
    finally:
        os._exit(0)


def wait_state(step: Step, timeout: float) -> dict:
    deadline = time.monotonic() + timeout + 10
    while not os.path.exists(step.path("state")):
        if time.monotonic() > deadline:
            fail("the play's container start never reported")
        time.sleep(0.05)
    with open(step.path("state")) as handle:
        return json.load(handle)


def container_pid(step: Step, config: dict, options: dict, job: dict[str, str]) -> int:
    """The stopped container process of this node's step; started by the first task."""
    # enroot_start_once (pyxis_slurmstepd.c:1283-1299): the first task starts it, the others
    # wait on the lock
    with step:
        if step.bump("init") == 1:
            start_container(step, config, options, job)
        state = wait_state(step, options["start_timeout"])
    if "error" not in state:
        return state["pid"]
    # pyxis' order: the start's error (pyxis_slurmstepd.c:956 or :961), enroot's log (:968-969),
    # then task_init's lines (:1358-1360)
    log = log_text(step)
    lines = [f"pyxis: {state['error']}"]
    if log:
        lines.append("pyxis: printing enroot log file:")
        lines += [f"pyxis:     {line}" for line in log.splitlines()]
    lines.append("pyxis: couldn't start container")
    if options["entrypoint"]:
        lines.append("pyxis: if the image has an unusual entrypoint, try using "
                     "--no-container-entrypoint")
    fail("\n".join(lines))
    return -1


# --- each task ------------------------------------------------------------------------------------

def proc_environ(pid: int) -> dict[str, str]:
    with open(f"/proc/{pid}/environ", "rb") as handle:
        data = handle.read().decode("utf-8", "surrogateescape")
    return dict(item.split("=", 1) for item in data.split("\0") if "=" in item)


def task_environment(job: dict[str, str], container: dict[str, str],
                     env_vars: list[str]) -> dict[str, str]:
    """``spank_import_container_env`` (pyxis_slurmstepd.c:584-635), then ``pytorch_setup``
    (:1240-1276)."""
    environment = {name: value for name, value in job.items()
                   if name not in TASK_DENY or name in env_vars}
    for name, value in container.items():
        if name in env_vars:
            environment.setdefault(name, value)  # overwrite=0, pyxis_slurmstepd.c:625-629
        else:
            environment[name] = value
    if "PYTORCH_VERSION" in environment:
        environment["RANK"] = job.get("SLURM_PROCID", "")
        environment["LOCAL_RANK"] = job.get("SLURM_LOCALID", "")
    return environment


def parse_task_options(argv: list[str]) -> tuple[dict, list[str]]:
    split = argv.index("--")
    options: dict = {"entrypoint": False, "env_vars": [], "mounts": [], "workdir": None}
    for word in argv[:split]:
        name, _, value = word[2:].partition("=")
        if name in ("container-entrypoint", "no-container-entrypoint"):
            options["entrypoint"] = name == "container-entrypoint"
        elif name == "container-env":
            options["env_vars"] = value.split(",")
            if "" in options["env_vars"]:
                fail(f"--container-env: invalid format: {value}")  # args.c:689-693
        elif name == "container-mounts":
            options["mounts"] = value.split(",")
        elif name == "container-workdir":
            options["workdir"] = value
        elif name == "container-image":
            options["image"] = value
    return options, argv[split + 1:]


def check_mounts(mounts: list[str]) -> None:
    """pyxis' ``SRC[:DST[:FLAGS]]`` entries (args.c:366-421 at 2eb8b711, the source rule at
    :293-302); the play can only give a source at its own path."""
    for entry in mounts:
        source, _, rest = entry.partition(":")
        target = rest.partition(":")[0] or source
        if not source or not source.startswith(("/", ".")):
            fail("mount source must be a relative path, an absolute path, \"tmpfs\" or \"umount\"")
        if not os.path.exists(source):
            fail(f"couldn't start container: mount source {source} does not exist")
        if os.path.realpath(source) != os.path.realpath(target):
            fail(f"the play cannot bind-mount {source} at {target} (no mount namespaces)")


def local_task_count(job: dict[str, str]) -> int:
    return len(job.get("SLURM_GTIDS", "0").split(","))


def task_main(argv: list[str]) -> None:
    options, command = parse_task_options(argv)
    if "image" not in options:
        fail("--container-image is required by the play (named containers are not played)")
    config = image_config(options["image"])
    with open(IMAGES) as handle:
        options["start_timeout"] = float(json.load(handle).get("start_timeout", 60))
    check_mounts(options["mounts"])
    job = dict(os.environ)
    step = Step(job)
    pid = container_pid(step, config, options, job)
    environment = task_environment(job, proc_environ(pid), options["env_vars"])
    os.chdir(options["workdir"] or os.readlink(f"/proc/{pid}/cwd"))
    # enroot_stop_once (pyxis_slurmstepd.c:1322, :985): the last task of the node lets the
    # container go on
    with step:
        if step.bump("started") == local_task_count(job):
            os.kill(pid, signal.SIGCONT)
    try:
        os.execvpe(command[0], command, environment)
    except OSError as exc:
        print(f"slurmstepd: error: execve(): {command[0]}: {exc.strerror}", file=sys.stderr)
        sys.exit(2)


def main() -> None:
    program = os.path.basename(sys.argv[0])
    try:
        if program == "srun":
            srun_main(sys.argv[1:])
        else:
            task_main(sys.argv[1:])
    except PyxisError as exc:
        print(f"pyxis: {exc}" if not str(exc).startswith("pyxis:") else exc, file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()

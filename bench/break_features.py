"""Break each feature on purpose and watch the test that names it fail (issue 27).

A test that stays green with its feature broken proves nothing. Each entry of ``BREAKS`` is a
deliberate, minimal break of one feature (a text replacement in one or more files) and the tests
that must then fail. For each break the script copies the checkout's tracked files to a scratch
folder (``.mnp/breaks/<name>``; the checkout is never modified), applies the break there, runs
each named test with the project's ``.venv`` python and expects it to fail. ``--pass-too`` also
runs each test on the unbroken copy first and expects it to pass.

A break whose text is no longer in its file (the code moved on) is reported as ``STALE``: update
the entry rather than let the check pass unseen.

Usage: ``python bench/break_features.py`` (all; the Docker ones build the cpu-tcp image with the
broken entrypoint and take minutes), ``--only NAME`` (repeatable), ``--list``.
Exit status: 0 when every break made its tests fail, 1 otherwise.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRATCH = ROOT / ".mnp" / "breaks"
MOUNT = {"MNP_TEST_MOUNT_ENTRYPOINT": "1"}  # the cluster tests run the copy's entrypoint/


@dataclass
class Break:
    name: str
    what: str
    edits: list  # (file, old text, new text)
    tests: list  # (pytest node id or "file -k expr", extra environment)
    extra_env: dict = field(default_factory=dict)


SLURM = "tests/integration/test_slurm_entrypoint.py"
CLUSTER = "tests/integration/test_entrypoint_cluster.py"
MPIJOB_WORKER = "tests/test_mpijob_worker_as_written.py"
CI = ".github/workflows/ci.yml"
GATES = "tests/publish/test_workflows.py::test_every_check_step_fails_its_job_when_its_check_fails"
BREAKS = [
    Break("signal-forwarding", "PID 1 records SIGTERM but no longer forwards it to the launcher",
          [("entrypoint/run/lifecycle.py", "                    os.kill(proc.pid, signum)\n",
            "                    pass  # broken on purpose: no forwarding\n")],
          [(f"{CLUSTER}::test_sigterm_to_the_main_node", MOUNT),
           (f"{SLURM}::test_scancel_stops_every_rank_and_the_job_is_cancelled", {})]),
    Break("exit-status", "the launcher's exit status is flattened to 0/1",
          [("entrypoint/run/outcome.py",
            '    return Outcome(code, errors.USER, node, "%s exited with %d; not retried"',
            '    return Outcome(1, errors.USER, node, "%s exited with %d; not retried"')],
          [(f"{SLURM} -k test_a_failing_ranks_exit_status_reaches_srun", {})]),
    Break("child-exit-status", "a child node told the job ended exits 1 whatever it did",
          [("entrypoint/run/batchnodes.py",
            "            return outcome.success(self.host.node, \"this node's part ended; ",
            "            return outcome.of_command(1, self.host.node, \"this node's part ended; ")],
          [(f"{CLUSTER}::test_a_child_killed_mid_run", MOUNT)]),
    Break("serial-builds", "the scheduler builds one layer at a time whatever --jobs says",
          [("matrix/image/schedule.py", "    jobs = max(1, jobs)\n", "    jobs = 1\n")],
          [("tests/test_build_parallel.py::test_two_branches_build_side_by_side_with_true_tags",
            {})]),
    Break("layer-tests-skipped", "layer tests are skipped even when run against a layer",
          [("images/conftest.py", '    if config.getoption("--mnp-layer"):\n        return\n', "")],
          [("tests/test_cpu_tcp.py -k other_stacks_would_run and cuda11.7-efa-aws-ofi-nccl", {})]),
    Break("plugin-version-string", "the probe expects the -aws suffix of the older tags",
          [("entrypoint/probe/fabric.py", r'r"^v?(\d+)\.(\d+)\.(\d+)(?![\d.])"',
            r'r"^v?(\d+)\.(\d+)\.(\d+)-aws"')],
          [("tests/entrypoint/test_ep_fabric.py::test_plugin_version_of_each_pinned_tag", {})]),
    Break("seed-values", "NCCL 2.4.8 gets '=eth0' and the doc's table is edited to match: the doc "
          "replay agrees, the articles' -x NCCL_SOCKET_IFNAME=eth0 does not",
          [("entrypoint/plan/envtable.py",
            '    Row("NCCL_SOCKET_IFNAME", "{interface}", {"nccl_node": True, "nccl": "<2.5.6"},',
            '    Row("NCCL_SOCKET_IFNAME", "={interface}", {"nccl_node": True, "nccl": "<2.5.6"},'),
           ("docs/seed-jobs.md", "| `NCCL_SOCKET_IFNAME=eth0` |", "| `NCCL_SOCKET_IFNAME==eth0` |")],
          [("tests/test_seed_jobs.py -k articles_own_values", {})]),
    Break("srun-mpi-none", "a one-task-per-node step leaves --mpi to the site's MpiDefault: under "
          "pmix every task is taken for one rank and mpirun never starts",
          [("matrix/jobs/sbatch.py", '    words = ["srun", "--mpi=pmix" if shape.mpi else "--mpi=none"]\n',
            '    words = ["srun"] + (["--mpi=pmix"] if shape.mpi else [])\n')],
          [("tests/integration/test_slurm_pyxis.py -k mpirun_inside_the_allocation", {})]),
    Break("slurm-self-wiring", "a Slurm step's SSH launcher is no longer wired by the entrypoints",
          [("entrypoint/settings/wiring.py",
            "    if not node.one_task_per_node():\n        return None\n", "    return None\n")],
          [("tests/entrypoint/test_ep_sched_plan.py -k wired_by_the_entrypoint", {})]),
    Break("ompi-off-slurm", "mpirun over the job's SSH inside a Slurm step is left to Open MPI's "
          "Slurm launcher and allocation reader",
          [("entrypoint/launchers/mpi.py", '            params += [("plm", "rsh"), ("ras", "^slurm")]\n',
            "            pass\n")],
          [("tests/entrypoint/test_ep_sched_plan.py -k keeps_off_slurms", {})]),
    Break("elastic-range", "torchrun gets MAX instead of MIN:MAX, so it cannot scale down",
          [("entrypoint/launchers/torchrun.py", '"--nnodes", elastic.nnodes,',
            '"--nnodes", elastic.nnodes.split(":")[-1],')],
          [("tests/integration/test_elastic_cluster.py"
            "::test_elastic_torchrun_scales_down_to_min_when_a_node_is_lost", {})]),
    # Issue 35: five breaks that once left every pull-request check green, and one more.
    Break("mpijob-worker-runs-command", "an MPIJob worker as invoke k8s writes it (args plus "
          "MNP_*) runs the job's command instead of serving SSH",
          [("entrypoint/run/main.py", '        if cfg.mode == "worker":\n            return outcome',
            '        if cfg.mode == "no-such-mode":\n            return outcome')],
          [(f"{MPIJOB_WORKER}::test_the_worker_serves_ssh_and_never_runs_the_command", {})]),
    Break("ci-unit-swallowed", "ci.yml's unit step ends in || true: a failing test passes the job",
          [(CI, '--no-loadscope-reorder -m "not docker and not slow"\n',
            '--no-loadscope-reorder -m "not docker and not slow" || true\n')],
          [(GATES, {})]),
    Break("ci-slow-may-fail", "ci.yml's slow job has continue-on-error: true",
          [(CI, "    timeout-minutes: 45\n    strategy:\n",
            "    timeout-minutes: 45\n    continue-on-error: true\n    strategy:\n")],
          [(GATES, {})]),
    Break("ci-test-echoed", "ci.yml echoes invoke test instead of running it",
          [(CI, "      - run: invoke test --stack cpu-tcp\n",
            "      - run: echo invoke test --stack cpu-tcp\n")],
          [(GATES, {})]),
    Break("slurm-backwards-range", "Slurm's backwards host ranges (node[3-1]) are accepted, as no "
          "host; the test needs no scontrol",
          [("entrypoint/schedulers/nodelist.py",
            '        if hi < lo:\n            raise ValueError("range %s is backwards in %r"'
            ' % (part, item))\n', "")],
          [("tests/test_hostlist_backwards.py", {"PATH": str(ROOT / ".venv" / "bin")})]),
    Break("plugin-selfcheck-anywhere", "the aws-ofi-nccl build's self-check greps for the "
          "version anywhere in the .so, not in its init message",
          [("images/aws-ofi-nccl/Dockerfile.j2",
            """ && said="$(LC_ALL=C grep -m 1 -aoE 'Initializing aws-ofi-nccl [!-~]{1,64}' """
            """{{ spec.options.prefix }}/lib/libnccl-net.so | sed -n 1p || true)" \\\n""",
            """ && grep -qa "{{ version }}" {{ spec.options.prefix }}/lib/libnccl-net.so \\\n"""
            """ && said={{ version }} \\\n""")],
          [("tests/test_plugin_version_check.py -k self_check", {})]),
    Break("plugin-layer-test-anywhere", "the aws-ofi-nccl layer test greps for the version "
          "anywhere in the .so",
          [("images/aws-ofi-nccl/test_aws_ofi_nccl.py", "    assert release == expected, said\n",
            "    assert host.run(f\"grep -qa '{layer['version']}' {lib.path}\").rc == 0\n")],
          [("tests/test_plugin_version_check.py -k layer_test", {})]),
    Break("efa-plugin-env-in-run", "NCCL_NET_PLUGIN=ofi moves from the EFA layer's ENV into a "
          "RUN export (it then lasts one shell)",
          [("images/efa/Dockerfile.j2",
            "/opt/amazon/efa/lib:$LD_LIBRARY_PATH \\\n    NCCL_NET_PLUGIN=ofi\n",
            "/opt/amazon/efa/lib:$LD_LIBRARY_PATH\nRUN export NCCL_NET_PLUGIN=ofi\n")],
          [("tests/test_dockerfile_env.py", {})]),
    Break("layer-tests-all-skipped", "invoke test passes a layer whose tests all skip",
          [("matrix/image/testing.py", "    empty = [r for r in results if r.ran_nothing]\n",
            "    empty = []\n")],
          [("tests/test_layer_tests_ran.py -k all_skip", {})]),
    Break("mount-over-image", "a --mount or --pvc over a folder the image installs into (/opt, "
          "/usr, /usr/local/bin) is accepted again, as before issue 42",
          [("matrix/jobs/mounts.py", "        if hidden:\n", "        if False:\n")],
          [("tests/publish/test_mount_folders.py -k image_folder and opt", {}),
           ("tests/publish/test_mount_folders.py::test_the_folders_come_from_each_stacks_templates",
            {})]),
    Break("mount-folders-declared", "ssh's template no longer declares /etc/ssh: a mount over "
          "/etc hides its sshd_config unseen",
          [("images/ssh/Dockerfile.j2", '"folders": {"/etc/ssh"', '"unread": {"/etc/ssh"')],
          [("tests/publish/test_mount_folders.py -k etc", {})]),
    Break("stack-targets-rule", "a CPU stack on a GPU type is valid in the stacks file again (the "
          "rule no longer applies to an 8-GPU instance), while every writer refuses the pair",
          [("matrix/model/rules.yaml", '    when: {instance.gpus: ">=1"}\n',
            '    when: {instance.gpus: ">=100"}\n')],
          [("tests/test_stack_targets.py::"
            "test_a_cpu_stack_on_a_gpu_type_is_invalid_with_the_rule_and_its_source", {})]),
]


def tracked_copy(target: Path) -> None:
    if target.exists():
        shutil.rmtree(target)
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, check=True,
                           capture_output=True).stdout.decode().split("\0")
    for name in filter(None, files):
        source = ROOT / name
        if source.is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)
    (target / ".venv").symlink_to(ROOT / ".venv")


def apply(target: Path, brk: Break) -> str | None:
    """Apply the break in ``target``; a one-line reason when it no longer applies."""
    for name, old, new in brk.edits:
        path = target / name
        text = path.read_text()
        if old not in text:
            return f"{name}: {old.strip()[:70]!r} not found"
        path.write_text(text.replace(old, new))
    return None


def run_test(target: Path, test: str, env: dict) -> tuple[int, str]:
    node, _, expr = test.partition(" -k ")
    argv = [str(ROOT / ".venv" / "bin" / "python"), "-m", "pytest", "-x", "-q",
            "-p", "no:cacheprovider", node] + (["-k", expr] if expr else [])
    proc = subprocess.run(argv, cwd=target, capture_output=True, text=True,
                          env=dict(os.environ, **env))
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    return proc.returncode, lines[-1] if lines else proc.stderr.strip()[-200:]


def check(brk: Break, pass_too: bool) -> bool:
    target = SCRATCH / brk.name
    tracked_copy(target)
    ok = True
    if pass_too:
        for test, env in brk.tests:
            code, last = run_test(target, test, env)
            print(f"  unbroken  {test}: {'passes' if code == 0 else 'FAILS'} ({last})")
            ok &= code == 0
    stale = apply(target, brk)
    if stale:
        print(f"  STALE: {stale}")
        return False
    for test, env in brk.tests:
        started = time.monotonic()
        code, last = run_test(target, test, env)
        failed = code == 1  # tests ran and failed (2-5: interrupted, usage, no tests)
        print(f"  broken    {test}: {'fails as it should' if failed else 'DID NOT FAIL'} "
              f"(exit {code}, {time.monotonic() - started:.0f} s: {last})", flush=True)
        ok &= failed
    shutil.rmtree(target)
    return ok


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--only", action="append", choices=[b.name for b in BREAKS])
    parser.add_argument("--pass-too", action="store_true",
                        help="also run each test on the unbroken copy (expects it to pass)")
    parser.add_argument("--list", action="store_true")
    args = parser.parse_args(argv)
    if args.list:
        for brk in BREAKS:
            print(f"{brk.name:22s} {brk.what}")
        return 0
    if not (ROOT / ".venv" / "bin" / "python").exists():
        sys.exit("bench/break_features.py: no .venv; run ./dev true first")
    results = {}
    for brk in BREAKS:
        if args.only and brk.name not in args.only:
            continue
        print(f"{brk.name}: {brk.what}", flush=True)
        results[brk.name] = check(brk, args.pass_too)
    bad = [name for name, ok in results.items() if not ok]
    print(f"{len(results) - len(bad)} of {len(results)} breaks made their tests fail"
          + (f"; not: {', '.join(bad)}" if bad else ""))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

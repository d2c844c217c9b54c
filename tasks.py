"""Command line: `invoke --list`. Each task parses its options and calls into matrix/.

Conventions every task follows (later tasks too):
- no short flags (``task`` below turns invoke's automatic ones off): ``-t`` or ``-e`` would mean
  different things in different tasks; long options mean one thing everywhere;
- ``--stack`` is declared iterable in every task (``iterable=["stack"]``), so repeating it is
  either several stacks or, for a one-stack command, one clear error (``options.one_stack``); it
  defaults to the stacks file's ``default_stack``; ``--stacks`` is the stacks file;
- options are parsed with the helpers in matrix/cli/options.py (``integer``, ``require``, ``choose``,
  ``pick_stacks``, ``emit_json``), so bad input is one line, never a traceback.
"""

import functools
import sys

import invoke

from matrix.cli import catalog, deploy, images, options, pipes, suite, usage

task = functools.partial(invoke.task, auto_shortflags=False)

STACKS = "stacks.yaml"
HELP = {"stacks": "stacks file (default ./stacks.yaml)",
        "stack": "a stack by name; repeat for several (default: default_stack of the stacks file)",
        "all": "every stack in the file"}
ONE = dict(HELP, stack="a stack by name (default: default_stack of the stacks file)")
JSON = "print JSON instead of a table"
MOUNT_HELP = ("HOST_PATH:CONTAINER_PATH[:ro], a host folder (e.g. FSx for Lustre at /fsx) at the "
              "same path on every node; repeat (default: none)")
ATTEMPTS_HELP = ("runs of the job, 1 to 10 (default 2): infrastructure failures (exit 200, a lost "
                 "host) are retried, a failing command never")


@task(help={"stacks": HELP["stacks"], "json": JSON,
            "names": "print only the stack names, one a line (for shell completion)",
            "instance_types": "print only the instance table's types, one a line (completion)",
            "launchers": "print only the launcher names, one a line (completion)",
            "values": "print only the values --OPTION takes, one a line (completion): "
                      "scheduler, kind or rdzv (default: none, the stacks are shown)"})
@options.user_errors
def stacks(c, stacks=STACKS, json=False, names=False, instance_types=False, launchers=False,
           values=None):
    """Every stack: base, components, target instances; valid, or why not, or not buildable yet."""
    if values is not None:
        print("\n".join(catalog.option_values(values)))
        return
    if instance_types or launchers:
        catalog.show_names(stacks, "instance-types" if instance_types else "launchers")
        return
    catalog.show_stacks(stacks, as_json=json, names_only=names)


@task(help=HELP, name="render", iterable=["stack"])
@options.user_errors
def render_(c, stack=None, all=False, stacks=STACKS):  # noqa: A002 - the option is --all
    """Render Dockerfiles into images/generated/ (next to the stacks file for another file)."""
    catalog.render(stacks, stack, all)


@task(help=dict(HELP, json=JSON), iterable=["stack"])
@options.user_errors
def plan(c, stack=None, all=False, stacks=STACKS, json=False):  # noqa: A002
    """Show layers, content-addressed tags, parents, shared layers and which are built."""
    catalog.show_plan(stacks, stack, all, as_json=json)


@task(help={"stacks": HELP["stacks"]})
@options.user_errors
def lint(c, stacks=STACKS):
    """Check the rendered Dockerfiles are fresh and pass hadolint (one line when they do)."""
    catalog.lint(stacks)


@task(help={"stacks": HELP["stacks"]})
@options.user_errors
def matrix(c, stacks=STACKS):
    """Print the GitHub Actions strategy JSON of the stacks CI builds."""
    catalog.ci_matrix(stacks)


BUILD_HELP = dict(HELP, registry="registry to pull unchanged layers from, e.g. an ECR URI "
                                   "(default: none, build them here)",
                  ca_bundle="extra CA bundle for downloads during the build (default: PIP_CERT, "
                            "REQUESTS_CA_BUNDLE or SSL_CERT_FILE); never stored in an image")


@task(help=dict(BUILD_HELP, test="run the layer tests after building (as `invoke test`)",
                json="print the build metadata as JSON on stdout (progress goes to stderr)",
                metadata_file="where to write the build metadata (default .mnp/build-metadata.json)",
                jobs="layers to build at once, a layer starting when its parent is built "
                     "(default: the machine's cores, 2 to 4)",
                pull_bases="pull each base again even when it is local, so a base re-pushed "
                           "under the same tag gets new layer tags (default: use local bases)"),
      iterable=["stack"])
@options.user_errors
def build(c, stack=None, all=False, stacks=STACKS, registry=None, ca_bundle=None,  # noqa: A002
          test=False, json=False, metadata_file=None, jobs=None, pull_bases=False):
    """Build stacks' layers (only what changed) under content-addressed tags."""
    images.build(stacks, stack, all, registry, ca_bundle, as_json=json, metadata_file=metadata_file,
                 jobs=jobs, pull_bases=pull_bases)
    if test:
        images.test_stack(stacks, stack, all, to_stderr=json)


@task(help={"stack": ONE["stack"], "stacks": HELP["stacks"],
            "output": "write it to this file, whole or not at all (default: print it)"},
      iterable=["stack"])
@options.user_errors
def sbom(c, stack=None, output=None, stacks=STACKS):
    """CycloneDX 1.6 JSON of a built stack's image: Debian packages, Python distributions,
    components built from source (URL, sha256); validated against the schema."""
    images.sbom(stacks, stack, output)


@task(help={"stack": ONE["stack"], "stacks": HELP["stacks"]}, iterable=["stack"])
@options.user_errors
def ref(c, stack=None, stacks=STACKS):
    """Print the final image reference of a stack (its content-addressed tag)."""
    images.ref(stacks, stack)


@task()
@options.user_errors
def engine(c):
    """Make sure a Docker engine runs (installs and starts dockerd as root on Debian/Ubuntu)."""
    images.start_engine()


@task(help=dict(HELP, again="run layers whose tests passed before with the same image and tests "
                            "too (default: those are reported as cached)"),
      name="test", iterable=["stack"])
@options.user_errors
def test_(c, stack=None, all=False, stacks=STACKS, again=False):  # noqa: A002
    """Run each layer's testinfra tests against its built image; records a pass for push."""
    images.test_stack(stacks, stack, all, again=again)


@task(help={"pytest": "extra pytest arguments, e.g. \"-k plan -x\" (default: none)"})
@options.user_errors
def check(c, pytest=""):
    """The whole test suite (README's test command, run by CI): ruff, lint, pytest."""
    suite.check(pytest)


@task(help={"stack": ONE["stack"], "registry": "registry URI, ECR or host[:port][/prefix] (required)",
            "force": "push even without a passing `invoke test` of this exact image (loud)",
            "stacks": HELP["stacks"]}, iterable=["stack"])
@options.user_errors
def push(c, stack=None, registry=None, force=False, stacks=STACKS):
    """Push every layer by content tag, then <stack> and <stack>-<git sha>, digests verified."""
    deploy.push(stacks, stack, registry, force)


@task(help={"stack": ONE["stack"], "nodes": "number of nodes, 1 to 10000 (required)",
            "instance_type": "e.g. p3dn.24xlarge (required)",
            "image_uri": "image by digest (default: the pushed digest of <repo>:<stack>, read from "
                         "a running Docker engine)",
            "secret_arn": "Secrets Manager ARN injected as MNP_SECRET (default: none)",
            "execution_role_arn": "role Batch uses to read the secret (default: none)",
            "launcher": "mpirun (default), deepspeed, torchrun, torch.distributed.launch or none",
            "output": "write the JSON to this file (default: print it)",
            "register": "call batch:RegisterJobDefinition",
            "region": "AWS region for --register (default: the AWS configuration's)",
            "profile": "AWS profile for --register (default: the AWS configuration's)",
            "mount": MOUNT_HELP, "attempts": ATTEMPTS_HELP, "stacks": HELP["stacks"]},
      iterable=["stack", "mount"])
@options.user_errors
def jobdef(c, stack=None, nodes=None, instance_type=None, image_uri=None, secret_arn=None,
           execution_role_arn=None, launcher="mpirun", output=None, register=False,
           region=None, profile=None, mount=None, attempts=None, stacks=STACKS):
    """Write an AWS Batch multi-node job definition for a stack (validated with botocore):
    invoke jobdef --stack S --nodes N --instance-type T [...] -- CMD..."""
    deploy.jobdef(stacks, stack, nodes, instance_type, image_uri, secret_arn,
                  execution_role_arn, launcher, output, register,
                  options.command_after_dashdash(sys.argv, c.remainder), region, profile, mount,
                  attempts)


GENERATOR_HELP = {
    "stack": ONE["stack"], "nodes": "number of nodes, 1 to 10000 (required)",
    "instance_type": "e.g. p4d.24xlarge (required)",
    "image_uri": "image by digest (default: the pushed digest of <repo>:<stack>, read from a "
                 "running Docker engine)",
    "output": "write it to this file, whole or not at all (default: print it)",
    "mount": None, "stacks": HELP["stacks"]}


@task(help=dict(GENERATOR_HELP, mount=MOUNT_HELP,
                launcher="mpirun (default: one Slurm task per rank, srun --mpi=pmix), deepspeed, "
                         "torchrun, torch.distributed.launch or none (one task per node)",
                ranks="with --launcher mpirun, who starts the ranks: srun (default: srun "
                      "--mpi=pmix, needs Slurm's PMIx) or mpirun (inside the allocation, from "
                      "node 0, over the job's own SSH; one task per node)",
                attempts="runs of the job, 1 to 10 (default 2): scontrol requeue after an "
                         "infrastructure failure (exit 200), never after a failing command"),
      iterable=["stack", "mount"])
@options.user_errors
def sbatch(c, stack=None, nodes=None, instance_type=None, image_uri=None, launcher="mpirun",
           ranks="srun", mount=None, output=None, attempts=None, stacks=STACKS):
    """Write a Slurm batch script (pyxis/enroot) running a stack on every node:
    invoke sbatch --stack S --nodes N --instance-type T [--mount H:C[:ro]]... -- CMD..."""
    deploy.sbatch(stacks, stack, nodes, instance_type, image_uri, launcher, output,
                  options.command_after_dashdash(sys.argv, c.remainder), mount, attempts, ranks)


@task(help=dict(GENERATOR_HELP, mount=MOUNT_HELP,
                kind="pytorchjob, trainjob or mpijob (required)",
                pvc="CLAIM:PATH[:ro], a persistent volume claim at PATH in every pod; repeat "
                    "(default: none)",
                elastic="MIN:MAX nodes of an elastic pytorchjob (c10d rendezvous; default: a "
                        "static job of --nodes)",
                attempts="runs of a pytorchjob or mpijob, 1 to 10 (default 2; backoffLimit is "
                         "one less): see docs/entrypoint.md Retries"),
      iterable=["stack", "mount", "pvc"])
@options.user_errors
def k8s(c, kind=None, stack=None, nodes=None, instance_type=None, image_uri=None, pvc=None,
        mount=None, elastic=None, output=None, attempts=None, stacks=STACKS):
    """Write a Kubeflow PyTorchJob, TrainJob or MPIJob (checked against the CRD schemas):
    invoke k8s --kind K --stack S --nodes N --instance-type T [...] -- CMD..."""
    deploy.k8s(stacks, stack, kind, nodes, instance_type, image_uri, elastic, output,
               options.command_after_dashdash(sys.argv, c.remainder), mount, pvc, attempts)


@task(help={"stack": ONE["stack"], "nodes": "number of nodes (containers), default 2",
            "late_node": "index of a node started late (default: none)", "mount": MOUNT_HELP,
            "attempts": "runs, as Batch retries the job definition of invoke jobdef: again "
                        "after the infrastructure code 200, never after a failing command "
                        "(default 1)",
            "env": "NAME=VALUE on every node (repeatable): MNP_* settings, checked as the "
                   "entrypoint checks them (e.g. MNP_HEALTH=full), or the command's variables "
                   "(default: none)",
            "stacks": HELP["stacks"]},
      iterable=["stack", "mount", "env"])
@options.user_errors
def run(c, stack=None, nodes="2", late_node=None, mount=None, attempts=None, env=None,
        stacks=STACKS):
    """Rehearse a Batch MNP job locally: invoke run --stack S --nodes N [--env N=V] -- COMMAND..."""
    code = deploy.rehearse(stacks, stack, nodes, late_node,
                        options.command_after_dashdash(sys.argv, c.remainder), mount, attempts,
                        env)
    sys.exit(code)


@task(help={"check": "verify only: pins against the index, downloads where reachable",
            "stacks": HELP["stacks"]})
@options.user_errors
def pin(c, check=False, stacks=STACKS):
    """Write pip pins' sha256, Requires-Python and wheel tag from PyPI into stacks.yaml (--check verifies)."""
    catalog.pin(stacks, check)


@task(help={"stack": ONE["stack"], "instance_type": "e.g. p4d.24xlarge (required)",
            "nodes": "number of nodes (default 2)",
            "launcher": "mpirun, deepspeed, torchrun, torch.distributed.launch or none (default: "
                        "the scheduler's: mpirun on batch and mpijob, torchrun on the others)",
            "scheduler": "batch (default), slurm, pytorchjob, trainjob or mpijob",
            "rdzv": "c10d, etcd or etcd-v2: an elastic pytorchjob's rendezvous (default: none, "
                    "a static job)",
            "json": "print the plan as JSON", "stacks": HELP["stacks"]},
      iterable=["stack"])
@options.user_errors
def explain(c, stack=None, instance_type=None, nodes="2", launcher=None, scheduler="batch",
            rdzv=None, json=False, stacks=STACKS):
    """The main node's plan for a stack on an instance type under a scheduler, without hardware
    or a build: invoke explain --stack S --instance-type T --nodes N [--scheduler K] -- CMD..."""
    deploy.explain(stacks, stack, instance_type, nodes, launcher, json,
                   options.command_after_dashdash(sys.argv, c.remainder), scheduler, rdzv)


# Read the command line before invoke's parser does, so that its messages ("No idea what
# 'python3' is!") never reach a user: one line saying what to type instead, exit 2. And a
# reader that stops early (invoke --list | head -1) ends the program quietly.
if sys.argv and sys.argv[0].rsplit("/", 1)[-1] in ("invoke", "inv", "__main__.py", "mnp-stacks"):
    pipes.install()
    usage.check(sys.argv, usage.parser_contexts(invoke.Collection.from_module(sys.modules[__name__])),
                with_command=("run", "explain", "jobdef", "sbatch", "k8s"),
                core=invoke.parser.ParserContext(args=invoke.Program().core_args()
                                                 + invoke.Program().task_args()))

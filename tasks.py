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

from matrix.cli import catalog, deploy, images, jobtasks, options, pipes, suite, usage

task = functools.partial(invoke.task, auto_shortflags=False)

STACKS = "stacks.yaml"
HELP = {"stacks": "stacks file (default ./stacks.yaml)",
        "stack": "a stack by name; repeat for several (default: default_stack of the stacks file)",
        "all": "every stack in the file"}
ONE = dict(HELP, stack="a stack by name (default: default_stack of the stacks file)")
JSON = "print JSON instead of a table"
MOUNT_HELP = ("HOST_PATH:CONTAINER_PATH[:ro], a host folder (e.g. FSx for Lustre at /fsx) at the "
              "same path on every node; repeat (default: none)")


@task(help={"stacks": HELP["stacks"], "json": JSON,
            "names": "print only the stack names, one a line (for shell completion)",
            "instance_types": "print only the instance table's types, one a line (completion)",
            "launchers": "print only the launcher names, one a line (completion)",
            "values": "print only the values --OPTION takes, one a line (completion), as the "
                      "tasks declare them, e.g. --values kind (default: none, the stacks are "
                      "shown)"})
@options.user_errors
def stacks(c, stacks=STACKS, json=False, names=False, instance_types=False, launchers=False,
           values=None):
    """Every stack: base, components, target instances; valid, or why not, or not buildable yet."""
    if values is not None:
        found = catalog.option_values(values, stacks)
        if found:
            print("\n".join(found))
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


@task(help=dict(BUILD_HELP, test="run the layer tests (as `invoke test`), each layer's once it "
                                 "is built, while the layers above it build",
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
                 jobs=jobs, pull_bases=pull_bases, test=test)


@task(help={"stack": ONE["stack"], "stacks": HELP["stacks"],
            "output": "write it to this file, whole or not at all (default: print it)"},
      iterable=["stack"])
@options.user_errors
def sbom(c, stack=None, output=None, stacks=STACKS):
    """CycloneDX 1.6 JSON of a built stack's image: Debian packages (with the Python
    distributions they own), other Python distributions, the entrypoint and components built
    from source (URL, sha256); validated against the schema."""
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


# The writers' tasks (jobdef, sbatch, k8s: one a module of matrix/jobs/ with a WRITER) and
# explain, made from the options each declares (matrix/cli/jobtasks.py).
for _task in jobtasks.tasks():
    globals()[_task.name.replace(".", "_")] = _task


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


# Read the command line before invoke's parser does, so that its messages ("No idea what
# 'python3' is!") never reach a user: one line saying what to type instead, exit 2. And a
# reader that stops early (invoke --list | head -1) ends the program quietly.
if sys.argv and sys.argv[0].rsplit("/", 1)[-1] in ("invoke", "inv", "__main__.py", "mnp-stacks"):
    pipes.install()
    usage.check(sys.argv, usage.parser_contexts(invoke.Collection.from_module(sys.modules[__name__])),
                with_command=jobtasks.command_tasks(),
                core=invoke.parser.ParserContext(args=invoke.Program().core_args()
                                                 + invoke.Program().task_args()))

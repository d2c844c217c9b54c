"""Command line: `invoke --list`. Each task parses its options and calls into matrix/."""

from invoke import task

from matrix import cli

STACKS = "stacks.yaml"
HELP = {"stacks": "stacks file (default ./stacks.yaml)", "stack": "one stack by name",
        "all": "every stack in the file"}


@task(help={"stacks": HELP["stacks"]})
@cli.user_errors
def stacks(c, stacks=STACKS):
    """Table of stacks: base, components, target instances, valid or why not."""
    cli.show_stacks(stacks)


@task(help=HELP, name="render")
@cli.user_errors
def render_(c, stack=None, all=False, stacks=STACKS):  # noqa: A002 - the option is --all
    """Render Dockerfiles into images/generated/ (validates the stacks first)."""
    cli.render(stacks, stack, all)


@task(help=HELP)
@cli.user_errors
def plan(c, stack=None, all=False, stacks=STACKS):  # noqa: A002
    """Show layers, content-addressed tags, parents and which stacks share them."""
    cli.show_plan(stacks, stack, all)


@task(help={"stacks": HELP["stacks"]})
@cli.user_errors
def lint(c, stacks=STACKS):
    """Check the rendered Dockerfiles are fresh and pass hadolint."""
    cli.lint(stacks)


@task(help={"stacks": HELP["stacks"]})
@cli.user_errors
def matrix(c, stacks=STACKS):
    """Print the GitHub Actions strategy JSON of the stacks CI builds."""
    cli.ci_matrix(stacks)


BUILD_HELP = dict(HELP, registry="registry to pull unchanged layers from (e.g. ECR URI)",
                  ca_bundle="extra CA bundle for downloads during the build (default: PIP_CERT, "
                            "REQUESTS_CA_BUNDLE or SSL_CERT_FILE); never stored in an image")


@task(help=BUILD_HELP)
@cli.user_errors
def build(c, stack=None, all=False, stacks=STACKS, registry=None, ca_bundle=None):  # noqa: A002
    """Build a stack's layers (only what changed) under content-addressed tags."""
    cli.build(stacks, stack, all, registry, ca_bundle)


@task(help={"stack": HELP["stack"], "stacks": HELP["stacks"]})
@cli.user_errors
def ref(c, stack, stacks=STACKS):
    """Print the final image reference of a stack (its content-addressed tag)."""
    cli.ref(stacks, stack)


@task
@cli.user_errors
def engine(c):
    """Make sure a Docker engine runs (installs and starts dockerd as root on Debian/Ubuntu)."""
    cli.start_engine()


@task(help=HELP, name="test")
@cli.user_errors
def test_(c, stack=None, all=False, stacks=STACKS):  # noqa: A002
    """Run each layer's testinfra tests against its built image; records a pass for push."""
    cli.test_stack(stacks, stack, all)

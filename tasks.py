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

"""What each ``invoke`` task does, one module a task group; ``tasks.py`` only parses options.

:mod:`~matrix.cli.options` holds what every task shares (option parsing, stack picking, loading,
one-line errors); :mod:`~matrix.cli.catalog` the stacks file and its plan; :mod:`~matrix.cli.images`
building and testing images; :mod:`~matrix.cli.deploy` pushing and running them;
:mod:`~matrix.cli.suite` the test suite.
"""

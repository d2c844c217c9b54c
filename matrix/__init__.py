"""Build system for layered multi-node deep-learning container stacks.

The path from ``stacks.yaml`` to an image: :mod:`matrix.loader` reads and schema-checks the file,
:mod:`matrix.rules` checks version compatibility, :mod:`matrix.plan` turns stacks into a DAG of
content-addressed layers, :mod:`matrix.render` writes one Dockerfile per layer, and
:mod:`matrix.build` builds them on a Docker engine.
"""

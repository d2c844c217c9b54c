"""Build system for layered multi-node deep-learning container stacks.

Rooms follow the pipeline and import only down it: :mod:`matrix.model` (the stacks file, rules,
instances) ← :mod:`matrix.image` (plan, render, build, test) ← :mod:`matrix.deploy` (push, job
definitions, rehearsal, explain) ← :mod:`matrix.cli` (one module a task group).
:mod:`matrix.errors` (one-line user errors) sits below all of them.
"""

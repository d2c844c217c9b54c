"""From a built image to a running job: push (``publish``, ``ecr``), Batch job definitions
(``jobdef``), a local rehearsal of a multi-node job (``rehearse``) and the main node's plan
without hardware (``explain``). May import the image and model rooms.
"""

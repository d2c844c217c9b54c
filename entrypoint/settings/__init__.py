"""The entrypoint's settings: the ``MNP_*`` variables and the scheduler's ``NodeTable``, read once."""

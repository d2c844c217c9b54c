"""What every room of the entrypoint shares: one-line errors, the log, the limits on what
the environment may ask for, the node record, version ranges. Imports nothing of the entrypoint."""

"""Jobs: what the generated artefacts start on each node, derived from the artefacts themselves
(``roles``), and the entrypoint's plan run on it (``contract``)."""

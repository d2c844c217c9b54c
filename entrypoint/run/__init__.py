"""What happens after the plan: the flow (``main``), Batch's main and children (``batchnodes``),
the MPIJob worker, per-job SSH and the supervised launcher (``lifecycle``)."""

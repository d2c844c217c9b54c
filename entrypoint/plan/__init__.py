"""The decision: ``make_plan(settings, facts)`` for every scheduler, with every variable's
reason and source. Names no launcher and no scheduler: those speak through their units and tables."""

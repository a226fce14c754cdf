"""Where a model of the spec comes from; ``load.load_source`` gives every kind the same interface, so
every source passes the same checks before anything enters the repository."""

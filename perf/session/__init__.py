"""Sessions on one real server, used by tune and plan alike: a model, a pipeline, and the probe."""

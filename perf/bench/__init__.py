"""Tools beside the tuner, never imported by it: ``python -m perf witness``."""

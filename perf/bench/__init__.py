"""Tools beside the tuner, each its own ``python -m perf`` subcommand and never imported by the
tuner: perf_analyzer beside our client on one configuration (``witness``, ``python -m perf witness``).
"""

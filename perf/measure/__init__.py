"""Measurement: what to load (``target``, ``shapes``), how (``loads``, ``engine``, ``analyzer`` for
perf_analyzer, ``raw``), one model at one load (``measurement.measure``) with every request's
``Record`` (``records``), the server's own view (``server_view``), the figures (``summary``) and the
host-noise policy (``noise``). Studies, sessions, tune and plan stand on it; it imports none of them.
"""

"""``make soak`` and the load it shares with the fault tests: closed-loop HTTP/gRPC callers
(``soak.mixed_load``), the faults injected at random (``soak.faults``), and the accounting that says
which failures a fault excuses and which requests were lost (``soak.report``).

These are clients of a server, not part of serving: ``server/`` starts, stops, guards and heals a
server; this package drives one and holds it to its promises.
"""

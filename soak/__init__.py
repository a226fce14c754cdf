"""``make soak`` and the load it shares with the fault tests: clients that drive a server and hold it to
its promises (``server/`` starts, guards and heals one)."""

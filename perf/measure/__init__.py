"""Measurement: one model at one load, every request's ``Record`` and the server's own view. Studies,
sessions, tune and plan stand on it; it imports none of them."""

"""Measurement: what to load, how, one model at one load with every request's ``Record``, the
server's own view and the host-noise policy. Studies, sessions, tune and plan stand on it; it imports
none of them.
"""

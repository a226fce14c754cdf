"""A model of Triton's dynamic batcher, with no I/O, no server and no clock: what the tuner predicts
with, and what a planner of several batchers in a row builds on.

- ``batcher``: the candidate configuration and the discrete-event simulation of the batcher;
- ``latency``: the article's ``T + (N-1)·Δt`` fitted to compute times per batch size;
- ``service``: the costs beyond compute, calibrated from figures a measurement hands in;
- ``cpu``: the wait for a CPU on a machine whose cores the server and its clients share;
- ``predict``: p99 at a load, and the highest rate within a p99 budget;
- ``tandem``: the stages of a split model, a batcher each, with the links between them;
- ``links``: what a stage boundary costs on each kind of link (the table, with its sources);
- ``memory``: memory per instance against a device's 80% headroom;
- ``grid``: the candidate configurations a search ranks.
"""

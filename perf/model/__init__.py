"""A model of Triton's dynamic batcher, with no I/O, no server and no clock: what the tuner predicts
with, and what the planner's chain of batchers builds on."""

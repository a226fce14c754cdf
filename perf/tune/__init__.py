"""``python -m perf tune``: pick the batching configuration for a latency budget.

Measure what the prediction needs (execution time per formed batch size, per-request overhead, the raw
backend), simulate Triton's dynamic batcher for every candidate configuration under the target load,
pick the one that sustains the most traffic within the p99 budget, write it as a spec overlay, build it
and verify it on the real server. ``--exhaustive`` measures the whole grid instead (the yardstick).
"""

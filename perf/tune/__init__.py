"""``make tune``: the batching configuration for a p99 budget, predicted and verified on the server
(docs/TUNE.md has the method and the code map)."""

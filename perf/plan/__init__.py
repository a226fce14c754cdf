"""The strategy planner (``make plan``): which architecture serves a model within a p99 budget, and
where its instances go on the machine's GPUs (docs/PLAN.md has the method and the code map)."""

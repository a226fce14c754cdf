"""The strategy planner (``make plan``): which architecture serves a model within a p99 budget, and
where its instances go on the machine's GPUs.

- ``topology``: the GPUs, their memory and the links between them (``nvidia-smi`` or a recorded folder);
- ``strategy``: what can be served (data, pipeline or hybrid parallel × instances × precision) and what
  the planner knows of the model (``ModelProfile``);
- ``placement``: stages and replicas on GPUs, over the fastest links, within each GPU's headroom;
- ``planner``: every strategy predicted (``perf.model``'s batcher and tandem) and the pick;
- ``profile``, ``verify``, ``overlay``, ``report``, ``cli``: the measured inputs, the check on the real
  server, the spec overlay with the server flags, and the report.
"""

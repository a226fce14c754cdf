"""The strategy planner (``make plan``): which architecture serves a model within a p99 budget, and
where its instances go on the machine's GPUs.

- ``topology``: the GPUs, their memory and the links between them (``nvidia-smi`` or a recorded folder);
- ``strategy``: what can be served (data, pipeline or hybrid parallel, or tables over GPUs × instances
  × precision) and what the planner knows of the model (``ModelProfile``);
- ``graph_memory``: memory per instance counted from the model's graph (nothing built);
- ``placement``: stages and replicas on GPUs, over the fastest links, within each GPU's headroom;
  ``tables``: embedding tables packed over GPUs and the exchange of looked-up rows;
- ``planner``: every strategy predicted (``perf.model``'s batcher and tandem) and the pick;
- ``profile``, ``verify``, ``overlay``, ``document``, ``report``, ``cli``: the measured inputs, the
  check on the real server, the spec overlay with the server flags, ``plan.json`` as types, and the
  report.
"""

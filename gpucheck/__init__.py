"""The GPU check (docs/GPU.md): the project's GPU claims measured on the lent GPU machine as it comes, in
one command. That machine is bare and offline and only the working tree plus a folder of wheels travel
(64 MiB), so this is a package of its own: ``carry`` builds the wheels (``make gpu-carry``), ``run``
measures there (``make gpu-check``), ``rehearse`` runs the same script here on the CPU (``make
gpu-rehearsal``).

Import rule: the standard library, what that machine has (torch, numpy, onnx, onnxruntime, yaml,
matplotlib), the carried packages and the project's ``exporters``, ``python_backend``, ``server``,
``client`` and ``perf.measure`` / ``perf.model`` / ``perf.plan.graph_memory``; never pydantic nor
PyTriton's Python API. The rehearsal enforces it."""

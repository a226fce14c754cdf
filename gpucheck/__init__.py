"""The GPU check: the project's GPU claims measured on a lent GPU machine as it comes, in one command.

The lent machine (DESIGN.md §3, docs/GPU.md) is bare and offline: its ``python3`` (3.12) has torch with
CUDA, onnx, onnxruntime (CPU only), numpy 2, grpcio, pyyaml, matplotlib, rich, tqdm and aiohttp, and
lacks tritonserver, tritonclient, TensorRT, onnxruntime-gpu and pydantic. Only the working tree and
an ignored folder of wheels travel (64 MiB in all), so this is a package of its own rather than part
of ``perf``: what it imports is exactly what that machine has plus what ``carry`` brings.

* ``carry`` (here, ``make gpu-carry``): the folder of wheels the machine lacks (tritonclient and its
  HTTP/gRPC stack, protobuf, grpcio, a trimmed ``nvidia-pytriton`` holding tritonserver and the
  Python 3.12 stub), within the travel budget.
* ``run`` (there, ``make gpu-check`` / ``scripts/gpu_check.sh``): builds a repository of torch-served
  models from ``models.yaml`` with that machine's torch, starts a real tritonserver on ``KIND_GPU``
  instance groups and measures (``studies``), then writes at most eight files (``report``).
* ``rehearse`` (here, ``make gpu-rehearsal``): the same script on this CPU, a tiny grid, ``KIND_CPU``,
  with the carried wheels and only the packages the GPU machine has (``rehearsal``).

Import rule: modules of this package import the standard library, torch, numpy, onnx, onnxruntime, yaml,
matplotlib, the carried packages and the project's ``exporters``, ``python_backend``, ``server``,
``client`` and ``perf.measure`` / ``perf.model`` / ``perf.plan.graph_memory``; never ``perf.saved`` or
anything else that needs pydantic, nor PyTriton's Python API (``import pytriton`` needs pyzmq, sh,
typer...). The rehearsal enforces it: it runs with nothing else on ``sys.path``.
"""

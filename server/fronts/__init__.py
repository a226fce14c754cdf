"""The two fronts that stand before tritonserver 2.51 on its public ports, and the request checks only
they use: ``http_front`` and ``grpc_front`` are the serving processes (``python -m
server.fronts.http_front``, started by ``server.launcher``); the checks of a request are pure functions
in modules of their own (``request_target``, ``kserve_json``, ``body_encoding`` for HTTP,
``grpc_request`` for gRPC), over what both share (``tensor_limits``, ``refusal``); system shared memory
is served by the fronts themselves (``client_regions``, the table; ``shm_http``, ``shm_grpc``). The
gRPC front speaks HTTP/2 itself (``h2c``: frames and flow control; ``grpc_wire``: its clients' calls;
``grpc_upstream``: its calls to Triton). See docs/SERVING.md, "The fronts"."""

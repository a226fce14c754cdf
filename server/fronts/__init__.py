"""The two fronts before tritonserver 2.51 on its public ports (``http_front``, ``grpc_front``, started by
``server.launcher``) and the request checks only they use; see docs/SERVING.md, "The fronts"."""

"""tritonclient HTTP/gRPC clients for the served repository: health, metadata, infer (with system
shared memory), statistics, and a check of the answer against the torch model."""

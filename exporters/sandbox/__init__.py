"""Archives from outside the project are opened only here, in a sandbox, and leave it as ONNX: a
``torch.export`` archive is code whatever a loader checks (docs/SERVING.md, "Trust boundary"). Archives
the project writes itself (pipeline stages, their SHA-256 recorded) are not outside archives."""

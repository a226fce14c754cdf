"""Where a model of the spec comes from: the zoo, the user's factory, an ONNX file, a ``torch.export``
program or a Hugging Face folder. ``load.load_source`` gives each the same interface (reference
outputs, identity for the content hash, the ONNX file to serve), so every source passes the same
checks before anything enters the repository. The user's code is imported in one place
(``user_code``), and every consumer draws a model's example inputs from ``inputs``."""

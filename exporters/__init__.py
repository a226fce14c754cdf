"""Exporters: spec (YAML) → torch model → ONNX → Triton model repository with schema-checked configs.

``LAYERS`` is the order of imports between the package's folders and top-level modules: a part imports
only from the layers before it, deferred imports included (``tests/unit/exporters/test_layers.py``).
"""

LAYERS: tuple[tuple[str, ...], ...] = (
    ("errors", "devices"),  # the exceptions; the GPUs and cores a build plans for
    ("zoo", "precision"),  # the project's own torch models; fp32 ONNX at fp16 or int8
    ("schema",),  # models.yaml: the spec, its dataclasses the schema
    ("configs", "artifacts"),  # Triton configs as typed dataclasses; an ONNX artifact and its checks
    ("sandbox",),  # archives from outside, opened only in a sandbox
    ("sources",),  # where a model comes from, and the example inputs drawn for it
    ("onnx_export", "memory"),  # a models: entry as checked ONNX; the memory one instance holds
    ("init", "text", "pipelines"),  # `exporters init`; text-embedding services; pipelines
    ("resolve", "repository"),  # models.yaml as a complete Spec; the repository build
    ("__main__",),  # python -m exporters build | validate | init
)

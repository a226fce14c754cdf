"""Exporters: spec (YAML) → torch model → ONNX → Triton model repository with schema-checked configs."""

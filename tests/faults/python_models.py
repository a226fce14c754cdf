"""Real Python-backend models the fault tests write into a repository: the lines every such model
starts with, and the entry of a model that takes ``x`` (FP32 [4]) and answers ``y``."""

from __future__ import annotations

from pathlib import Path

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

# The stub ignores PYTHONPATH (see python_backend/runtime_paths.py): a model puts the launcher's on
# sys.path before it imports numpy or triton_python_backend_utils.
STUB_PATH = """
import os
import sys

sys.path[:0] = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p not in sys.path]
"""


def write_x_to_y_model(repository: Path, name: str, model_py: str) -> None:
    """``name``: a Python-backend model of one instance, ``x`` FP32 [4] in and ``y`` out, no batching,
    running ``model_py`` (``STUB_PATH`` put first)."""
    config = model_config_pb2.ModelConfig(name=name, backend="python", max_batch_size=0)
    config.input.add(name="x", data_type=model_config_pb2.TYPE_FP32, dims=[4])
    config.output.add(name="y", data_type=model_config_pb2.TYPE_FP32, dims=[4])
    config.instance_group.add(kind=model_config_pb2.ModelInstanceGroup.KIND_CPU, count=1)
    (repository / name / "1").mkdir(parents=True)
    (repository / name / "config.pbtxt").write_text(text_format.MessageToString(config))
    (repository / name / "1" / "model.py").write_text(STUB_PATH + model_py)

"""A real Python-backend model whose requests take as long as they ask (``seconds``), for the deadline
and per-client limit rows of the fault matrix (rows 56–58): a stand-in for any model slower than its
deadline, served by the real tritonserver like every model of the repository."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from google.protobuf import text_format
from python_models import STUB_PATH
from resilience_fixtures import build_small_repository
from tritonclient.grpc import model_config_pb2, service_pb2

from server import ServerOptions, TritonServer

SLOW = "slow"
DEADLINE_S = 3.0  # the model's request_deadline_s: the fronts answer 504 after this long
MAX_BATCH = 64  # the requests that wait are answered by one sleep, so a drain is quick
MODEL_PY = (
    STUB_PATH
    + '''
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Sleeps as long as the longest request of the batch asks (at most 60 s), then answers each
    request with what it asked: a model that is simply slow."""

    def execute(self, requests):
        asked = [pb_utils.get_input_tensor_by_name(r, "seconds").as_numpy() for r in requests]
        time.sleep(min(60.0, max(float(a.max()) for a in asked)))
        return [pb_utils.InferenceResponse([pb_utils.Tensor("slept", a.astype(np.float32))]) for a in asked]
'''
)


def write_slow_model(
    repository: Path, deadline_s: float = DEADLINE_S, instances: int = 1, max_batch: int = MAX_BATCH
) -> None:
    """``slow``: ``seconds`` FP32 [batch, 1] in, the same out, after sleeping that long; dynamic batching
    gathers up to ``max_batch`` of the requests that wait, so one sleep answers a batch of them (with 1,
    every request but the one running waits in Triton's queue, where its metrics count it)."""
    config = model_config_pb2.ModelConfig(name=SLOW, backend="python", max_batch_size=max_batch)
    config.input.add(name="seconds", data_type=model_config_pb2.TYPE_FP32, dims=[1])
    config.output.add(name="slept", data_type=model_config_pb2.TYPE_FP32, dims=[1])
    config.instance_group.add(kind=model_config_pb2.ModelInstanceGroup.KIND_CPU, count=instances)
    config.dynamic_batching.max_queue_delay_microseconds = 1000
    config.parameters["request_deadline_s"].string_value = f"{deadline_s:g}"
    (repository / SLOW / "1").mkdir(parents=True)
    (repository / SLOW / "config.pbtxt").write_text(text_format.MessageToString(config))
    (repository / SLOW / "1" / "model.py").write_text(MODEL_PY)


def slow_request(seconds: float) -> bytes:
    """A serialized ``ModelInferRequest`` asking ``slow`` for ``seconds``."""
    request = service_pb2.ModelInferRequest(model_name=SLOW)
    request.inputs.add(name="seconds", datatype="FP32", shape=[1, 1])
    request.raw_input_contents.append(np.float32([[seconds]]).tobytes())
    return request.SerializeToString()


@contextlib.contextmanager
def slow_model_server(
    spec_data: dict[str, Any],
    tmp_path_factory: pytest.TempPathFactory,
    name: str,
    deadline_s: float,
    **fronts: bool,
) -> Iterator[TritonServer]:
    """A server of its own with ``trivial`` and ``slow``, whose one instance takes as long as a request
    asks (``max_batch`` 1): what the fronts (``fronts``: ``http_front=True`` and the like) let reach it
    waits in its queue, where Triton counts it. ``name`` names its folders."""
    repository = build_small_repository(
        spec_data, tmp_path_factory.mktemp(f"{name}_repository"), pipeline=False
    )
    write_slow_model(repository, deadline_s=deadline_s, max_batch=1)
    options = ServerOptions(
        repository=repository,
        self_heal=False,  # a stub asleep for a minute is what this model does, not a stuck one to heal
        startup_timeout_s=240,
        stop_timeout_s=5,  # Triton still runs what the front forwarded: do not wait for it
        exit_timeout_s=3,
        workdir=tmp_path_factory.mktemp(f"{name}_workdir"),
        **fronts,
    )
    with TritonServer(options) as running:
        assert running.failed_models == {}, running.describe_failures()
        yield running

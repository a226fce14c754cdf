"""A python-based ``onnxruntime`` backend: serves ``backend: "onnxruntime"`` models where the native
C++ backend is absent (the nvidia-pytriton wheel's tritonserver).

Installed as ``<backend-dir>/onnxruntime/model.py``, so one repository runs here and on the native
backend in the NGC container. It reads only standard config fields plus the input guards' parameters
(``exporters.schema.guards``; the native backend ignores them). The requests of an ``execute`` run as
one onnxruntime call (``batching``); a bad request gets its own error. Served with ``backend:
"python"`` from a model's own folder, it also zero-pads ``allow_ragged_batch`` inputs to the longest.
"""

import json
import os
from operator import methodcaller

from runtime_paths import add_launcher_paths

add_launcher_paths()

import numpy as np  # noqa: E402
import onnxruntime as ort  # noqa: E402
import triton_python_backend_utils as pb_utils  # noqa: E402
from batching import (  # noqa: E402
    InvalidInputError,
    TensorInfo,
    check_shared_axes,
    config_parameter,
    error_response,
    pad_concatenate,
    padding_counters,
    read_inputs,
    run_batched,
    shared_axes,
    with_value_guards,
)
from onnxruntime.capi.onnxruntime_pybind11_state import InvalidArgument  # noqa: E402
from ort_session import open_session  # noqa: E402


def _tensor_infos(entries: list[dict]) -> list[TensorInfo]:
    return [TensorInfo(e["name"], _numpy_dtype(e), tuple(int(d) for d in e["dims"])) for e in entries]


def _numpy_dtype(entry: dict) -> np.dtype:
    """The numpy dtype of a config entry's ``data_type`` (an input, or a warm-up sample's input)."""
    return np.dtype(pb_utils.triton_string_to_numpy(entry["data_type"]))


def _thread_count(config: dict, key: str) -> int:
    value = config_parameter(config, key) or "0"
    if not value.isdigit():
        raise pb_utils.TritonModelException(
            f"{config['name']}: parameter {key} must be an integer >= 0, got {value!r}"
        )
    return int(value)


WARMUP_PARAMETER = "warmup_formed_sizes"  # exporters.configs.models writes it; the native backend ignores it


def larger_sizes(config: dict) -> list[int]:
    """The batch sizes above 1 this config's dynamic batcher forms: preferred sizes and ``max_batch_size``."""
    top = int(config.get("max_batch_size", 0))
    if top <= 1 or "dynamic_batching" not in config:
        return []
    preferred = (int(s) for s in config["dynamic_batching"].get("preferred_batch_size", []))
    return sorted({*(s for s in preferred if 1 < s <= top), top})


def warmup_feeds(config: dict) -> list[dict]:
    """Zero inputs at every ``larger_sizes`` for each batch-1 warm-up sample (if ``WARMUP_PARAMETER``):
    ``model_warmup`` stays at batch 1, so a config whose ``max_batch_size`` is lowered still loads."""
    if config_parameter(config, WARMUP_PARAMETER) != "true":
        return []
    samples = [s["inputs"] for s in config.get("model_warmup", []) if int(s.get("batch_size", 1)) == 1]
    return [
        {name: np.zeros((size, *(int(d) for d in t["dims"])), _numpy_dtype(t)) for name, t in sample.items()}
        for sample in samples
        for size in larger_sizes(config)
    ]


def choose_providers(config: dict, args: dict, cache_dir: str) -> list:
    """Providers for this instance: CPU on KIND_CPU; CUDA (after TensorRT FP16 if asked) on KIND_GPU."""
    device_id = int(args["model_instance_device_id"])
    if args["model_instance_kind"] != "GPU":
        return ["CPUExecutionProvider"]
    available = ort.get_available_providers()
    if "CUDAExecutionProvider" not in available:
        raise pb_utils.TritonModelException(
            f"instance on GPU {device_id} but onnxruntime has no CUDA provider (available: {available})"
        )
    accelerators = config.get("optimization", {}).get("execution_accelerators", {})
    tensorrt = any(a.get("name") == "tensorrt" for a in accelerators.get("gpu_execution_accelerator", []))
    cuda = ("CUDAExecutionProvider", {"device_id": device_id})
    if not (tensorrt and "TensorrtExecutionProvider" in available):
        return [cuda]
    options = {"device_id": device_id, "trt_fp16_enable": True, "trt_engine_cache_enable": True}
    return [("TensorrtExecutionProvider", {**options, "trt_engine_cache_path": cache_dir}), cuda]


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        config = json.loads(args["model_config"])
        self.name = config["name"]
        try:
            self.inputs = with_value_guards(_tensor_infos(config["input"]), config)
        except ValueError as error:
            raise pb_utils.TritonModelException(f"{self.name}: {error}") from error
        self.outputs = _tensor_infos(config["output"])
        version_dir = os.path.join(args["model_repository"], args["model_version"])
        filename = config.get("default_model_filename") or "model.onnx"
        if filename.endswith(".py"):  # served with backend "python", the field names this script
            filename = "model.onnx"
        path = os.path.join(version_dir, filename)
        if not os.path.isfile(path):
            raise pb_utils.TritonModelException(f"{self.name}: no model file at {path}")
        threads = [_thread_count(config, f"{kind}_op_thread_count") for kind in ("intra", "inter")]
        providers = choose_providers(config, args, os.path.join(version_dir, "trt_cache"))
        self.session = open_session(path, *threads, providers)
        declared = {t.name for t in self.inputs}
        actual = {i.name for i in self.session.get_inputs()}
        if declared != actual:
            raise pb_utils.TritonModelException(
                f"{self.name}: config inputs {sorted(declared)} != model {sorted(actual)}"
            )
        self.output_names = [t.name for t in self.outputs]
        for feeds in warmup_feeds(config):
            self.session.run(self.output_names, feeds)
        # an axis shared at dim 0 alone is the batch, which check_layout holds to one row count
        self.shared_axes = {
            axis: places
            for axis, places in shared_axes(self.session.get_inputs()).items()
            if any(index > 0 for _, index in places)
        }
        ragged = [e["name"] for e in config["input"] if e.get("allow_ragged_batch")]
        self.concatenate = pad_concatenate if ragged else np.concatenate
        self.ragged_input = ragged[0] if ragged else None
        if ragged:  # what padding per formed batch costs: elements received vs elements computed
            what = "elements of the first ragged input: as received, and as computed after padding"
            self.elements = padding_counters(
                pb_utils, "ragged_batch_elements_total", what, self.name, "computed"
            )

    def _run(self, feeds: dict) -> dict:
        if self.ragged_input is not None:
            self.elements.padded.increment(int(feeds[self.ragged_input].size))
        try:
            outputs = self.session.run(self.output_names, feeds)
        except InvalidArgument as error:
            # shapes and dtypes were checked, so a value is bad (an id outside a table): the client's fault
            suspects = [t.name for t in self.inputs if t.dtype.kind in "iu"] or [t.name for t in self.inputs]
            names = ", ".join(f"'{n}'" for n in suspects)
            raise InvalidInputError(f"input {names} holds a value the model rejects: {error}") from error
        return dict(zip(self.output_names, outputs, strict=True))

    def _read(self, request) -> dict | InvalidInputError:
        # one pass: pb_utils.get_input_tensor_by_name lists every input per name
        given = {tensor.name(): tensor for tensor in request.inputs()}
        arrays = read_inputs(given, [t.name for t in self.inputs], methodcaller("as_numpy"))
        try:
            if not isinstance(arrays, Exception):
                check_shared_axes(arrays, self.shared_axes)
        except InvalidInputError as error:
            return error
        return arrays

    def execute(self, requests: list) -> list:
        read = [self._read(r) for r in requests]
        if self.ragged_input is not None:  # one metric update per execute: each is a call to the server
            received = sum(a[self.ragged_input].size for a in read if not isinstance(a, Exception))
            if received:
                self.elements.real.increment(int(received))
        results = run_batched(read, self.inputs, self._run, self.concatenate)
        # each result is a C-contiguous row slice, which pb_utils.Tensor takes without a copy
        return [
            error_response(pb_utils, result)
            if isinstance(result, Exception)
            else pb_utils.InferenceResponse(
                output_tensors=[pb_utils.Tensor(name, result[name]) for name in self.output_names]
            )
            for result in results
        ]

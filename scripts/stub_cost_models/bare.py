"""Batching with nothing else (``scripts/stub_cost.py``): the requests' inputs concatenated, one
onnxruntime run, the outputs split. No checks, no error handling: the least an onnxruntime model on the
Python backend does, to tell onnxruntime inside the stub apart from our backend's checks."""

import json
import os

from runtime_paths import add_launcher_paths

add_launcher_paths()

import numpy as np  # noqa: E402
import onnxruntime as ort  # noqa: E402
import triton_python_backend_utils as pb_utils  # noqa: E402


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        config = json.loads(args["model_config"])
        threads = {
            k: int(v["string_value"]) for k, v in config["parameters"].items() if k.endswith("thread_count")
        }
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads.get("intra_op_thread_count", 0)
        options.inter_op_num_threads = threads.get("inter_op_thread_count", 0)
        path = os.path.join(args["model_repository"], args["model_version"], "model.onnx")
        self.session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
        self.inputs = [entry["name"] for entry in config["input"]]
        self.outputs = [entry["name"] for entry in config["output"]]

    def execute(self, requests: list) -> list:
        arrays = [{tensor.name(): tensor.as_numpy() for tensor in request.inputs()} for request in requests]
        feeds = {name: np.concatenate([a[name] for a in arrays]) for name in self.inputs}
        outputs = self.session.run(self.outputs, feeds)
        responses, start = [], 0
        for a in arrays:
            rows = a[self.inputs[0]].shape[0]
            tensors = [
                pb_utils.Tensor(n, o[start : start + rows])
                for n, o in zip(self.outputs, outputs, strict=True)
            ]
            responses.append(pb_utils.InferenceResponse(output_tensors=tensors))
            start += rows
        return responses

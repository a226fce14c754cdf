"""The least a Python-backend model does (``scripts/stub_cost.py``): each request's rows read, zeros
answered. Its time is the Python backend's own round trip, which no model.py removes."""

from runtime_paths import add_launcher_paths

add_launcher_paths()

import numpy as np  # noqa: E402
import triton_python_backend_utils as pb_utils  # noqa: E402


class TritonPythonModel:
    def execute(self, requests: list) -> list:
        responses = []
        for request in requests:
            rows = request.inputs()[0].as_numpy().shape[0]
            output = pb_utils.Tensor("probability", np.zeros((rows, 1), np.float32))
            responses.append(pb_utils.InferenceResponse(output_tensors=[output]))
        return responses

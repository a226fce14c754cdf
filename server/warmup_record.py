"""What the server sent itself before any client: each model's statistics right after its warm-up.

Triton runs a model's ``model_warmup`` samples through it at load and counts them in the model's
statistics like any request (the onnxruntime backend's own warm-up of larger sizes runs inside the
backend and is not counted): before a client sends anything, ``/v2/models/<m>/stats`` says "1 inference
in 1 execution, compute 416 ms". ``make serve`` records those statistics in ``.run/server.json`` once
the server is ready, for each model version whose counts are exactly what its config's warm-up sends
(so no client request is among them), and ``client stats`` subtracts them: counts and times alike.
"""

from __future__ import annotations

import logging
from typing import Any

import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

log = logging.getLogger(__name__)


def warmup_counts(config: dict[str, Any]) -> tuple[int, int]:
    """(executions, inferences) a model's config makes Triton run at load: each ``model_warmup`` sample
    ``count`` times (0 means once) at its ``batch_size`` (0: a model without batching, one sample)."""
    executions = inferences = 0
    for sample in config.get("model_warmup", []):
        times = int(sample.get("count", 0)) or 1
        executions += times
        inferences += times * max(int(sample.get("batch_size", 0)), 1)
    return executions, inferences


def warmup_snapshot(url: str) -> dict[str, dict[str, dict[str, Any]]]:
    """``{model: {version: statistics}}`` read from Triton's own HTTP endpoint at ``url``, for every
    version whose counts are exactly its warm-up's; {} where the server cannot be read (nothing is
    subtracted then, and ``client stats`` says the warm-up is included)."""
    client = httpclient.InferenceServerClient(url)
    try:
        entries = client.get_inference_statistics("").get("model_stats", [])
        recorded: dict[str, dict[str, dict[str, Any]]] = {}
        for entry in entries:
            executions, inferences = warmup_counts(client.get_model_config(entry["name"]))
            counted = (int(entry.get("execution_count", 0)), int(entry.get("inference_count", 0)))
            if executions and counted == (executions, inferences):
                recorded.setdefault(entry["name"], {})[str(entry.get("version", ""))] = entry
        return recorded
    except (InferenceServerException, OSError) as error:
        log.warning("warm-up statistics not recorded (%s); client stats will include them", error)
        return {}
    finally:
        client.close()

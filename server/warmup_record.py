"""What the server sent itself before any client: each model's statistics right after its warm-up.

Triton counts its ``model_warmup`` samples like requests; ``make serve`` records them in
``.run/server.json`` (only where the counts are exactly the warm-up's) and ``client stats`` subtracts them.
"""

from __future__ import annotations

import logging
from typing import Any

import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

log = logging.getLogger(__name__)


def warmup_counts(config: dict[str, Any]) -> tuple[int, int]:
    """(executions, inferences) a config's ``model_warmup`` makes Triton run at load."""
    executions = inferences = 0
    for sample in config.get("model_warmup", []):
        times = int(sample.get("count", 0)) or 1
        executions += times
        inferences += times * max(int(sample.get("batch_size", 0)), 1)
    return executions, inferences


def warmup_snapshot(url: str) -> dict[str, dict[str, dict[str, Any]]]:
    """``{model: {version: statistics}}`` of every version whose counts are exactly its warm-up's; {}
    where the server cannot be read."""
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

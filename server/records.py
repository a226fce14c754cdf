"""The JSON records ``make serve`` keeps in ``.run/``: written whole or not at all, {} when absent; and
the warm-up it records in ``server.json``: Triton counts its ``model_warmup`` samples like requests, so
``client stats`` subtracts them (only where the counts are exactly the warm-up's)."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from python_backend.atomic_files import write_text

log = logging.getLogger(__name__)


def write_record(path: Path, data: Any) -> None:
    """Write ``data`` as JSON over ``path``: a reader sees the old record or the new one."""
    write_text(path, json.dumps(data, indent=2))


def read_record(path: Path) -> dict:
    """The record at ``path``; {} if there is none or it cannot be read."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


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

"""The folder a report-writing command works in: ``reports/<timestamp>[-<kind>]/``, with its log (a new
timestamp per run keeps earlier reports; the log is where a surprising figure is traced back)."""

from __future__ import annotations

import logging
from datetime import datetime
from pathlib import Path

LOG_FORMAT = "%(asctime)s %(name)s %(levelname)s %(message)s"


def report_folder(reports: Path, kind: str = "", log_name: str | None = None) -> Path:
    """Create ``reports/<timestamp>-<kind>`` (no suffix without ``kind``); with ``log_name``, send this
    process's INFO log there (unless logging is already set up, as under pytest)."""
    folder = reports / (datetime.now().strftime("%Y%m%d-%H%M%S") + (f"-{kind}" if kind else ""))
    folder.mkdir(parents=True, exist_ok=True)
    if log_name is not None:
        logging.basicConfig(level=logging.INFO, filename=folder / log_name, format=LOG_FORMAT)
    return folder

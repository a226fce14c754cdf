"""NVIDIA perf_analyzer as a cross-check, where a real binary is installed.

``tritonclient[all]`` installs a ``perf_analyzer`` *Python package* that is only a placeholder, and the
PyPI build of the real tool needs glibc ≥ 2.38; so the binary is searched for and run once before it
is trusted. Absent, we say how to get it and stop cleanly.
"""

from __future__ import annotations

import base64
import csv
import io
import json
import logging
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from perf.errors import StudyError

log = logging.getLogger(__name__)

HOW_TO_GET_IT = """perf_analyzer is not installed (or does not run) on this machine.
Our own load generator (`make perf`) does not need it; it is only a cross-check. To get it:
  * glibc >= 2.38 (e.g. Ubuntu 24.04): .venv/bin/pip install perf-analyzer
  * any Docker host: the Triton SDK image, e.g. `docker run --rm --net=host
    nvcr.io/nvidia/tritonserver:<yy.mm>-py3-sdk perf_analyzer -m <model> -u 127.0.0.1:<grpc-port> -i grpc`
  * or build it from https://github.com/triton-inference-server/perf_analyzer
Then set PERF_ANALYZER=/path/to/perf_analyzer (or put it on PATH) and run `make perf-analyzer` again.
This machine's glibc: {glibc}."""


def glibc_version() -> str:
    try:
        return os.confstr("CS_GNU_LIBC_VERSION") or "unknown"
    except (ValueError, OSError):
        return "unknown"


def find_perf_analyzer() -> Path | None:
    """A perf_analyzer executable that is a real program and runs, or None.

    Probed with ``--version``: the 2.41.0 release (the one that runs on glibc 2.34, installed into the
    venv by ``perf.perf_analyzer_install``) rejects ``--help`` as an unrecognized option.
    """
    from perf.perf_analyzer_install import InstallError, installed_wrapper, probe

    candidates = [os.environ.get("PERF_ANALYZER"), installed_wrapper(), shutil.which("perf_analyzer")]
    for candidate in filter(None, candidates):
        path = Path(candidate)
        if not (path.is_file() and os.access(path, os.X_OK)):
            continue
        try:
            probe(path)
        except InstallError:
            continue
        return path
    return None


# Two cores shared with other work never give perf_analyzer's default 10% window stability (nor 50%:
# measured; it then fails "Failed to obtain stable measurement"); with 100% it averages its last 3
# windows like our fixed windows do, and at most 4 windows bound its time.
NOISY_MACHINE = ("--stability-percentage", "100", "--max-trials", "4")


@dataclass(frozen=True)
class AnalyzerResult:
    concurrency: int
    throughput: float
    p50_ms: float
    p90_ms: float
    p99_ms: float
    settings: tuple[str, ...] = ()  # the measurement options it ran with (reports print them)

    @property
    def settings_text(self) -> str:
        return " ".join(self.settings)


def _tensor_data(row: np.ndarray) -> dict:
    """One input of one sample in ``--input-data`` JSON: a list of values, or for fp16 (which 2.41.0
    refuses as a list: "Can not use explicit tensor description for fp16 datatype") its raw bytes."""
    if row.dtype == np.float16:
        return {"content": {"b64": base64.b64encode(row.tobytes()).decode()}, "shape": list(row.shape)}
    return {"content": row.ravel().tolist(), "shape": list(row.shape)}


def write_input_data(inputs: dict[str, np.ndarray], path: Path, rows: int = 16) -> Path:
    """perf_analyzer's ``--input-data`` JSON from our input pool, so ids stay inside the tables."""
    data = [
        {name: _tensor_data(pool[i]) for name, pool in inputs.items()}
        for i in range(min(rows, next(iter(inputs.values())).shape[0]))
    ]
    path.write_text(json.dumps({"data": data}))
    return path


UNSTABLE = "Failed to obtain stable measurement"  # perf_analyzer's words when its windows disagree
LONGER_WINDOWS = 2  # the window length's factor for the one run after an unstable one


def run_perf_analyzer(
    binary: Path, model: str, url: str, protocol: str, concurrency: int, window_ms: int, out: Path,
    inputs: dict[str, np.ndarray], extra_args: tuple[str, ...] = NOISY_MACHINE,
) -> AnalyzerResult:  # fmt: skip
    """Run perf_analyzer at one concurrency with our inputs; parse its CSV (latencies in µs).

    ``extra_args`` default to the stability settings that converge on a shared 2-core machine. Where
    its windows still disagree beyond them it is run once more with windows ``LONGER_WINDOWS`` times as
    long, as its own message advises ("try to increase the --measurement-interval"): on a host the
    hypervisor takes CPU from in stalls (``perf.tune.steal``), a 1 s window at c=4 came out unstable
    with 100% (``make test`` on a fresh clone, a morning of 14-15 of 15 runs stolen), and a longer
    window averages over more of the stalls. The result carries the settings of the run that counted.
    """
    csv_path = out / f"perf_analyzer_{model}_c{concurrency}.csv"
    data = write_input_data(inputs, out / f"perf_analyzer_{model}_inputs.json")
    log_text = ""
    for window in (window_ms, LONGER_WINDOWS * window_ms):
        settings = ("--measurement-interval", str(window), *extra_args)
        command = [
            str(binary), "-m", model, "-u", url, "-i", protocol, "--concurrency-range", str(concurrency),
            "--percentile", "99", "-f", str(csv_path), "--input-data", str(data), *settings,
        ]  # fmt: skip
        done = subprocess.run(command, capture_output=True, text=True, timeout=600)
        log_text += f"$ {' '.join(command)}\n{done.stdout}{done.stderr}"
        (out / f"perf_analyzer_{model}_c{concurrency}.log").write_text(log_text)
        if done.returncode == 0:
            return read_analyzer_csv(csv_path, concurrency, settings)
        if UNSTABLE not in done.stdout + done.stderr:
            break
        log.info("perf_analyzer unstable with %d ms windows at c=%d: once more, longer", window, concurrency)
    raise StudyError(f"perf_analyzer failed ({done.returncode}): {done.stderr[-500:]}")


def read_analyzer_csv(csv_path: Path, concurrency: int, settings: tuple[str, ...] = ()) -> AnalyzerResult:
    """perf_analyzer's own figures from its ``-f`` CSV (first row; latencies there are in µs)."""
    row = next(csv.DictReader(io.StringIO(csv_path.read_text())))
    return AnalyzerResult(
        concurrency, float(row["Inferences/Second"]), float(row["p50 latency"]) / 1e3,
        float(row["p90 latency"]) / 1e3, float(row["p99 latency"]) / 1e3, settings,
    )  # fmt: skip

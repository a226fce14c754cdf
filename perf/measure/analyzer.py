"""NVIDIA perf_analyzer as a load engine (``PerfAnalyzerEngine``), found where a real binary runs; how
2.41.0 windows, judges and fails a run, and how we answer it: docs/PERF.md, "One measurement, two
engines"."""

from __future__ import annotations

import base64
import csv
import io
import itertools
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

import numpy as np

from perf.errors import OptionError, StudyError
from perf.measure.engine import Edge, EngineFigures, Job, Measurement, MeasureSettings, sized_for
from perf.measure.loads import Load, arrival_times
from perf.measure.records import Record
from perf.measure.target import Target
from perf.perf_analyzer_install import InstallError, installed_wrapper, probe, unavailable_reason
from server.supervisor import death_cause

log = logging.getLogger(__name__)

HOW_TO_GET_IT = """perf_analyzer is not installed (or does not run) on this machine.
Our own load generator (`make perf`) does not need it; it is only a cross-check. To get it:
  * glibc >= 2.38 (e.g. Ubuntu 24.04): .venv/bin/pip install perf-analyzer
  * any Docker host: the Triton SDK image, e.g. `docker run --rm --net=host
    nvcr.io/nvidia/tritonserver:<yy.mm>-py3-sdk perf_analyzer -m <model> -u 127.0.0.1:<grpc-port> -i grpc`
  * or build it from https://github.com/triton-inference-server/perf_analyzer
Then set PERF_ANALYZER=/path/to/perf_analyzer (or put it on PATH) and run `make perf-analyzer` again.
This machine's glibc: {glibc}."""
WINDOW_STRETCH = 1.2  # a window lasts this × --measurement-interval (measured, 2.41.0)
WINDOWS_JUDGED = 3  # perf_analyzer judges, and reports, its last three windows
CLOSED_LOOP_TRIALS = 10  # its own default --max-trials: on two shared cores c=16 needed five
UNSTABLE = "Failed to obtain stable measurement"
EMPTY_WINDOW = "No valid requests recorded within time interval"
INPUT_ROWS = 16  # rows of the input pool written to --input-data (a cycling target: all, up to the cap)
INPUT_ROWS_MAX = 4096
SHAPED_REQUESTS = 256  # requests of a variable-length target written to --input-data


def glibc_version() -> str:
    try:
        return os.confstr("CS_GNU_LIBC_VERSION") or "unknown"
    except (ValueError, OSError):
        return "unknown"


def find_perf_analyzer(prefix: Path | None = None) -> Path | None:
    """A perf_analyzer that runs, or None: ``$PERF_ANALYZER``, the one ``make perf-analyzer`` installed
    into the venv at ``prefix`` (this one's by default), then ``PATH``."""
    candidates = [os.environ.get("PERF_ANALYZER"), installed_wrapper(prefix), shutil.which("perf_analyzer")]
    for candidate in filter(None, candidates):
        try:
            probe(Path(candidate))
        except InstallError:  # not there, not a program that runs, or not the real tool
            continue
        return Path(candidate)
    return None


def unavailable_message() -> str:
    """Why perf_analyzer cannot run here, and how to fix it."""
    reason = unavailable_reason() or "not installed or does not run"
    return f"perf_analyzer is unavailable ({reason}); install it with `make perf-analyzer`"


def _tensor_data(row: np.ndarray) -> dict:
    """One input of one sample in ``--input-data`` JSON; fp16 as raw bytes (2.41.0 refuses it as a list)."""
    if row.dtype == np.float16:
        return {"content": {"b64": base64.b64encode(row.tobytes()).decode()}, "shape": list(row.shape)}
    return {"content": row.ravel().tolist(), "shape": list(row.shape)}


def write_input_data(target: Target, path: Path) -> Path:
    """perf_analyzer's ``--input-data``, samples it sends in turn: rows of our input pool (ids stay inside
    the tables), or a variable-length target's requests at their sent lengths, as ours send them."""
    if target.shapes is not None:
        pools = [target.shapes.pools[sent] for _, sent in target.shapes.requests[:SHAPED_REQUESTS]]
        samples = [{name: pool[0] for name, pool in inputs.items()} for inputs in pools]
    else:
        rows = next(iter(target.inputs.values())).shape[0]
        count = min(INPUT_ROWS_MAX if target.cycle else INPUT_ROWS, rows)
        samples = [{name: pool[i] for name, pool in target.inputs.items()} for i in range(count)]
    data = [{name: _tensor_data(row) for name, row in sample.items()} for sample in samples]
    path.write_text(json.dumps({"data": data}))
    return path


def window_options(settings: MeasureSettings, longer: float = 1.0, closed: bool = False) -> tuple[str, ...]:
    """``settings`` as perf_analyzer's options (windows ``longer`` times as long). A closed loop gets at
    least ``CLOSED_LOOP_TRIALS`` windows: without agreement it writes nothing at all."""
    interval_ms = max(1, round(longer * settings.window_s * 1000 / WINDOW_STRETCH))
    trials = max(WINDOWS_JUDGED, settings.max_windows, CLOSED_LOOP_TRIALS if closed else 0)
    windows = ["--measurement-interval", str(interval_ms), "--max-trials", str(trials)]
    return (*windows, "--stability-percentage", f"{100 * settings.tolerance:g}")


def command(
    binary: Path, target: Target, load_options: list[str], windows: tuple[str, ...], folder: Path,
    extra: tuple[str, ...] = (),
) -> list[str]:  # fmt: skip
    """The project's perf_analyzer command line for ``target``, its CSV and export into ``folder``."""
    if target.collect != 1:
        raise OptionError(f"perf_analyzer sends single samples, not collect={target.collect}")
    data = write_input_data(target, folder / "inputs.json")
    line = [str(binary), "-m", target.model, "-u", target.url, "-i", target.protocol]
    line += ["--input-data", str(data), "-f", str(folder / "figures.csv")]
    line += ["--profile-export-file", str(folder / "export.json"), *load_options, *windows, *extra]
    if target.shared_memory:
        line += ["--shared-memory", "system"]
    return line


def read_analyzer_csv(path: Path, settings: tuple[str, ...] = ()) -> EngineFigures:
    """perf_analyzer's own figures from its ``-f`` CSV (latencies there in µs)."""
    row = next(csv.DictReader(io.StringIO(path.read_text())))
    latencies_ms = (float(row[f"p{q} latency"]) / 1e3 for q in (50, 99))
    return EngineFigures(float(row["Inferences/Second"]), *latencies_ms, settings)


def read_export(path: Path, target: Target, label: str) -> tuple[list[Record], list[tuple[float, float]]]:
    """perf_analyzer's profile export of one experiment (wall-clock ns) as our records and windows, in
    seconds from the first window's start, each request arriving when sent."""
    experiments = json.loads(path.read_text()).get("experiments") or []
    if len(experiments) != 1:
        raise StudyError(f"{path}: expected one experiment in perf_analyzer's export, got {len(experiments)}")
    start = int(experiments[0]["window_boundaries"][0])
    edges = [(int(b) - start) / 1e9 for b in experiments[0]["window_boundaries"]]
    sent = sum(a[0].nbytes for a in target.inputs.values())  # one row of each input
    received = sum(target.output_row_bytes.values())
    records = []
    for request in sorted(experiments[0]["requests"], key=lambda r: r["timestamp"]):
        send, recv = (request["timestamp"] - start) / 1e9, (max(request["response_timestamps"]) - start) / 1e9
        records.append(Record(target.model, send, recv, 1, sent, received, True, "ok", (send,), label))
    return records, list(itertools.pairwise(edges))


def failure_message(returncode: int, output: str, label: str) -> str:
    """Why a perf_analyzer run failed, for people: how it exited, then the end of what it printed (which
    need not say: a process the kernel kills says nothing). This engine kills a run only past its
    timeout, so a SIGKILL is someone else's, the out-of-memory killer's most likely."""
    how = death_cause(returncode, "") if returncode else "no export written"
    if returncode == -signal.SIGKILL:
        how += " (not by this engine: the kernel's out-of-memory killer, most likely; dmesg names it)"
    return f"perf_analyzer failed on {label}: {how}: {output[-600:].strip()}"


class PerfAnalyzerEngine:
    """perf_analyzer as a ``LoadEngine``; each run's command line and output are appended to
    ``log_folder``/perf_analyzer.log, and every run adds the options ``extra``."""

    def __init__(
        self, binary: Path | None = None, log_folder: Path | None = None, extra: tuple[str, ...] = ()
    ) -> None:
        found = binary or find_perf_analyzer()
        if found is None:
            raise OptionError(unavailable_message())
        self.binary = found
        match = re.search(r"Version\s+(\S+)", probe(found))
        self.name = f"perf_analyzer {match.group(1) if match else 'unknown version'}"
        self.log_folder = log_folder
        self.extra = extra

    def run(self, job: Job, at_edge: Edge | None = None) -> Measurement:
        """``job`` in perf_analyzer's windows (``at_edge`` is not called: another process runs them)."""
        target, load, label = job.target, job.load, job.label
        settings = sized_for(job.settings, load, WINDOWS_JUDGED, label)
        with tempfile.TemporaryDirectory(prefix="perf_analyzer_") as scratch:
            folder = Path(scratch)
            for longer in (1.0, 2.0):
                windows = window_options(settings, longer, closed=load.kind == "closed")
                load_options = self._load_options(load, settings, longer, folder, target.max_in_flight)
                line = command(self.binary, target, load_options, windows, folder, self.extra)
                returncode, output = self._call(line, settings.longest_s * longer, label)
                if returncode == 0 and (folder / "export.json").is_file():
                    break
                if not (UNSTABLE in output or EMPTY_WINDOW in output) or longer > 1.0:
                    raise StudyError(failure_message(returncode, output, label or target.model))
                why = "disagreed" if UNSTABLE in output else "had one with no request answered"
                log.info("%s: perf_analyzer's windows %s; once more, twice as long", label, why)
            figures = folder / "figures.csv"  # absent where an open loop's windows never agreed
            own = read_analyzer_csv(figures, windows) if figures.is_file() else None
            records, windows = read_export(folder / "export.json", target, label)
        used = (max(0, len(windows) - WINDOWS_JUDGED), len(windows))
        return job.measurement(
            self.name, records, windows, used, UNSTABLE not in output, len(records), own=own
        )

    @staticmethod
    def _load_options(
        load: Load, settings: MeasureSettings, longer: float, folder: Path, in_flight: int
    ) -> list[str]:
        """A closed loop's concurrency, or an open loop's arrivals as intervals (µs) for every window it
        may measure, sent by ``in_flight`` threads with one request each (its synchronous mode): a thread
        behind its schedule sends late, so a rate beyond the server's is served below the rate offered
        (not sustained), as our engine sheds it. Its ``--async`` keeps every late request in flight and
        grows without bound (docs/TUNE.md, perf_analyzer's open loop)."""
        if load.kind == "closed":
            return ["--concurrency-range", str(load.concurrency)]
        seconds = settings.max_windows * settings.window_s * longer * WINDOW_STRETCH + 1.0
        arrivals = arrival_times(load, seconds)
        if arrivals.size == 0:
            raise OptionError(f"{load.name}: no arrival within {seconds:.1f} s")
        gaps_us = np.maximum(1, np.rint(np.diff(np.concatenate([[0.0], arrivals])) * 1e6).astype(np.int64))
        intervals = folder / "intervals.txt"
        intervals.write_text("\n".join(map(str, gaps_us.tolist())) + "\n")
        return ["--request-intervals", str(intervals), "--max-threads", str(in_flight)]

    def _call(self, line: list[str], seconds: float, label: str) -> tuple[int, str]:
        """Run ``line``: its exit status and output, logged to ``log_folder``."""
        try:
            done = subprocess.run(line, capture_output=True, text=True, timeout=120 + 3 * seconds)
            returncode, output = done.returncode, done.stdout + done.stderr
        except subprocess.TimeoutExpired as error:
            returncode, output = -1, f"did not finish in {error.timeout:.0f} s"
        if self.log_folder is not None:
            with open(self.log_folder / "perf_analyzer.log", "a") as handle:
                handle.write(f"# {label}\n$ {' '.join(line)}\n(exit {returncode})\n{output}\n")
        if returncode == -1:
            raise StudyError(f"perf_analyzer on {label}: {output}")
        return returncode, output

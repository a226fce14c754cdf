"""NVIDIA perf_analyzer: found where a real binary runs, driven through the one command line of the
project, and wrapped as a load engine (``PerfAnalyzerEngine``) behind ``perf.measure.engine.LoadEngine``.

``tritonclient[all]`` installs a ``perf_analyzer`` *Python package* that is only a placeholder, and the
PyPI build of the real tool needs glibc ≥ 2.38; so the binary is searched for and run once before it
is trusted (``perf.perf_analyzer_install`` installs the 2.41.0 build that runs on glibc 2.34).

Its measurement is its own: ``MeasureSettings`` become ``--measurement-interval``, ``--max-trials``
and ``--stability-percentage``, and perf_analyzer keeps measuring windows until its last three agree
within that percentage on throughput and average latency (the rule ``perf.measure.engine.OurEngine`` applies
too), or the trials run out. Measured with 2.41.0:

* a window lasts 1.2 × ``--measurement-interval`` (``WINDOW_STRETCH``);
* ``--profile-export-file`` holds every request of every window (``timestamp`` and
  ``response_timestamps`` in nanoseconds of the wall clock, and the ``window_boundaries``); records
  are built from it, and the last three windows count, as in perf_analyzer's own CSV;
* a closed loop (``--concurrency-range``) whose windows never agree exits 2 with
  "Failed to obtain stable measurement" and writes neither file: it is measured once more with windows
  twice as long, as its message advises; twice unstable is an error. An open loop
  (``--request-intervals``, ``--async``) whose windows never agree exits 0 and writes the export but
  no CSV: the run is kept and marked unstable;
* a window with no request answered in it fails the whole run ("No valid requests recorded within
  time interval"): an open loop's windows are those ``perf.measure.engine.sized_for`` sizes for a p99
  (the last three expect ``P99_SAMPLES`` arrivals and more, so a window expects over 30), and a run
  that still has one (a rate past the cap) is measured once more with windows twice as long;
* any failed call ends it ("Thread [0] had error: …"), and so does a model reload under load ("failed
  to find the requested model version" at the next window): a run never reloads under load.
"""

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
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from perf.errors import OptionError, StudyError
from perf.measure.engine import Edge, EngineFigures, EngineRun, Job, MeasureSettings, sized_for
from perf.measure.loads import Load, arrival_times
from perf.measure.records import Record
from perf.measure.target import Target
from perf.perf_analyzer_install import InstallError, installed_wrapper, probe, unavailable_reason

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
CLOSED_LOOP_TRIALS = 10  # perf_analyzer's own default --max-trials, the least a closed loop gets
UNSTABLE = "Failed to obtain stable measurement"  # its words when its windows never agree
# its words when a window ended with no request answered in it: the run fails, whatever came before
EMPTY_WINDOW = "No valid requests recorded within time interval"
INPUT_ROWS = 16  # rows of the input pool written to --input-data (a cycling target: all, up to the cap)
INPUT_ROWS_MAX = 4096
SHAPED_REQUESTS = 256  # requests of a variable-length target written to --input-data, each at its length


def glibc_version() -> str:
    try:
        return os.confstr("CS_GNU_LIBC_VERSION") or "unknown"
    except (ValueError, OSError):
        return "unknown"


def find_perf_analyzer(prefix: Path | None = None) -> Path | None:
    """A perf_analyzer executable that is a real program and runs, or None: ``$PERF_ANALYZER``, the one
    ``make perf-analyzer`` installed into the venv at ``prefix`` (this one's by default), then ``PATH``.

    Probed with ``--version``: the 2.41.0 release rejects ``--help`` as an unrecognized option.
    """
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
    """One input of one sample in ``--input-data`` JSON: a list of values, or for fp16 (which 2.41.0
    refuses as a list: "Can not use explicit tensor description for fp16 datatype") its raw bytes."""
    if row.dtype == np.float16:
        return {"content": {"b64": base64.b64encode(row.tobytes()).decode()}, "shape": list(row.shape)}
    return {"content": row.ravel().tolist(), "shape": list(row.shape)}


def write_input_data(target: Target, path: Path) -> Path:
    """perf_analyzer's ``--input-data`` JSON, one entry per sample, which it sends in turn: rows of our
    input pool (so ids stay inside the tables), all of a cycling target's up to ``INPUT_ROWS_MAX``; for
    a model with a variable axis, the requests of its ``ShapePlan`` in turn, each at the length it is
    sent at, so its runs carry the traffic's lengths as ours do (``perf.measure.shapes``)."""
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
    least perf_analyzer's own default of ``CLOSED_LOOP_TRIALS`` windows: without agreement it writes
    nothing at all, and on two shared cores its windows at concurrency 16 agreed within 10% after five
    (measured), more than a short profile's three."""
    interval_ms = max(1, round(longer * settings.window_s * 1000 / WINDOW_STRETCH))
    trials = max(WINDOWS_JUDGED, settings.max_windows, CLOSED_LOOP_TRIALS if closed else 0)
    return (
        "--measurement-interval",
        str(interval_ms),
        "--max-trials",
        str(trials),
        "--stability-percentage",
        f"{100 * settings.tolerance:g}",
    )


def command(
    binary: Path,
    target: Target,
    load_options: list[str],
    windows: tuple[str, ...],
    folder: Path,
    extra: tuple[str, ...] = (),
) -> list[str]:
    """The project's perf_analyzer command line: ``target`` with our inputs, ``load_options`` (a
    concurrency or request intervals), ``windows`` (``window_options``), its CSV and export into
    ``folder``, and ``extra`` options (e.g. ``-H name:value``, a header on every request)."""
    if target.collect != 1:
        raise OptionError(f"perf_analyzer sends single samples, not collect={target.collect}")
    data = write_input_data(target, folder / "inputs.json")
    line = [
        str(binary),
        "-m",
        target.model,
        "-u",
        target.url,
        "-i",
        target.protocol,
        "--input-data",
        str(data),
        "-f",
        str(folder / "figures.csv"),
        "--profile-export-file",
        str(folder / "export.json"),
        *load_options,
        *windows,
        *extra,
    ]
    if target.shared_memory:
        line += ["--shared-memory", "system"]
    return line


def read_analyzer_csv(path: Path, settings: tuple[str, ...] = ()) -> EngineFigures:
    """perf_analyzer's own figures from its ``-f`` CSV (first row; latencies there are in µs)."""
    row = next(csv.DictReader(io.StringIO(path.read_text())))
    latencies_ms = (float(row[f"p{q} latency"]) / 1e3 for q in (50, 90, 99))
    return EngineFigures(float(row["Inferences/Second"]), *latencies_ms, settings)


@dataclass(frozen=True)
class Export:
    """perf_analyzer's profile export of one experiment, times in wall-clock nanoseconds."""

    sends_ns: np.ndarray
    receives_ns: np.ndarray  # the last response of each request
    windows_ns: tuple[int, ...]

    @classmethod
    def read(cls, path: Path) -> Export:
        document = json.loads(path.read_text())
        experiments = document.get("experiments") or []
        if len(experiments) != 1:
            raise StudyError(
                f"{path}: expected one experiment in perf_analyzer's export, got {len(experiments)}"
            )
        requests = sorted(experiments[0]["requests"], key=lambda r: r["timestamp"])
        return cls(
            np.array([r["timestamp"] for r in requests], dtype=np.int64),
            np.array([max(r["response_timestamps"]) for r in requests], dtype=np.int64),
            tuple(int(b) for b in experiments[0]["window_boundaries"]),
        )

    @property
    def windows(self) -> list[tuple[float, float]]:
        """The windows in seconds from the first one's start (the records' clock)."""
        edges = [(b - self.windows_ns[0]) / 1e9 for b in self.windows_ns]
        return list(itertools.pairwise(edges))

    def records(self, target: Target, label: str) -> list[Record]:
        """One record per exported request, on the windows' clock; a request's arrival is its send
        time (an open loop's sends lagged their schedule by at most 3.6 ms at 800/s, measured)."""
        start = self.windows_ns[0]
        sent = sum(a[0].nbytes for a in target.inputs.values())  # one row of each input
        received = sum(target.output_row_bytes.values())
        sends = ((self.sends_ns - start) / 1e9).tolist()
        receives = ((self.receives_ns - start) / 1e9).tolist()
        return [
            Record(target.model, s, r, 1, sent, received, True, "ok", (s,), label)
            for s, r in zip(sends, receives, strict=True)
        ]


class PerfAnalyzerEngine:
    """perf_analyzer as a ``perf.measure.engine.LoadEngine``. ``log_folder``: where each run's command
    line and output are appended (``perf_analyzer.log``), e.g. a report folder; ``extra``: options every run
    adds (``command``)."""

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

    def run(self, job: Job, at_edge: Edge | None = None) -> EngineRun:
        """``job`` in perf_analyzer's windows (``at_edge`` is not called: it runs in its own process)."""
        target, load, label = job.target, job.load, job.label
        settings = sized_for(job.settings, load, WINDOWS_JUDGED, label)
        with tempfile.TemporaryDirectory(prefix="perf_analyzer_") as scratch:
            folder = Path(scratch)
            for longer in (1.0, 2.0):
                windows = window_options(settings, longer, closed=load.kind == "closed")
                load_options = self._load_options(load, settings, longer, folder)
                line = command(self.binary, target, load_options, windows, folder, self.extra)
                returncode, output = self._call(line, settings.longest_s * longer, label)
                if returncode == 0 and (folder / "export.json").is_file():
                    break
                if not (UNSTABLE in output or EMPTY_WINDOW in output) or longer > 1.0:
                    raise StudyError(
                        f"perf_analyzer failed on {label or target.model}: {output[-600:].strip()}"
                    )
                why = "disagreed" if UNSTABLE in output else "had one with no request answered"
                log.info("%s: perf_analyzer's windows %s; once more, twice as long", label, why)
            export = Export.read(folder / "export.json")
            figures = folder / "figures.csv"  # absent where an open loop's windows never agreed
            own = read_analyzer_csv(figures, windows) if figures.is_file() else None
        records, windows = export.records(target, label), export.windows
        used = (max(0, len(windows) - WINDOWS_JUDGED), len(windows))
        return EngineRun(records, windows, used, UNSTABLE not in output, len(records), own)

    @staticmethod
    def _load_options(load: Load, settings: MeasureSettings, longer: float, folder: Path) -> list[str]:
        """A closed loop's concurrency, or an open loop's arrivals as intervals (µs) for every window
        perf_analyzer may measure, each ``longer`` times ``settings``' (it plays the file again from the
        top if its windows outlast it)."""
        if load.kind == "closed":
            return ["--concurrency-range", str(load.concurrency)]
        seconds = settings.max_windows * settings.window_s * longer * WINDOW_STRETCH + 1.0
        arrivals = arrival_times(load, seconds)
        if arrivals.size == 0:
            raise OptionError(f"{load.name}: no arrival within {seconds:.1f} s")
        gaps_us = np.maximum(1, np.rint(np.diff(np.concatenate([[0.0], arrivals])) * 1e6).astype(np.int64))
        intervals = folder / "intervals.txt"
        intervals.write_text("\n".join(map(str, gaps_us.tolist())) + "\n")
        return ["--async", "--request-intervals", str(intervals)]

    def _call(self, line: list[str], seconds: float, label: str) -> tuple[int, str]:
        """Run ``line``: its exit status and output (stdout and stderr), logged where ``log_folder``
        says."""
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

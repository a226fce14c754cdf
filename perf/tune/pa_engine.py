"""perf_analyzer as the tuner's load engine: its C++ client sends, our ``Record``s come from its export.

On two shared cores our Python client falls behind perf_analyzer at c=16 (measured 30–34% below it,
2 processes), so where perf_analyzer is installed it can drive the load instead. It writes every
request it measured to ``--profile-export-file`` (2.41.0: ``experiments[0].requests[*]`` with
``timestamp`` and ``response_timestamps`` in nanoseconds of the wall clock, plus the measurement
``window_boundaries``); ``records_from_export`` turns those into our records, on the records' usual
timeline (seconds from the start of the load, which ``last_start`` maps to ``time.perf_counter``).

What perf_analyzer's export holds, measured with 2.41.0:
* only requests that completed inside its measurement windows. A closed loop therefore leaves out the
  requests sent until its threads stop after the last window (the server counted about 1% more at
  c=16: 34-56 more of 4,400-7,200); an open loop whose requests are still queued when the windows
  close (overload) gets those arrivals back as failed records (``UNANSWERED``), so every arrival
  given ends as exactly one record;
* the send time, not the scheduled time: an open-loop record's arrival is its **send time**. Measured
  at 800/s the sends lagged the schedule by at most 3.6 ms.

Measurement: exactly three time windows (stability disabled: ``--stability-percentage`` far above any
spread, ``--max-trials 3``), each ``1/3.6`` of the load's length because perf_analyzer stretches a
window to 1.2× ``--measurement-interval`` (measured). Open loops replay our arrivals with
``--request-intervals`` and ``--async`` (its synchronous request-rate mode offers at most ~800/s here),
followed by one long pause so that it sends no arrival twice before the windows close.

Any failed call makes perf_analyzer exit ("Thread [0] had error: …"; an error here, not failed
records), and so does a model reload under load ("failed to find the requested model version" at the
next window; both measured), so ``--follow`` keeps our engine.
"""

from __future__ import annotations

import json
import logging
import re
import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from perf.analyzer import AnalyzerResult, find_perf_analyzer, read_analyzer_csv, write_input_data
from perf.errors import OptionError, StudyError
from perf.perf_analyzer_install import unavailable_reason
from perf.records import Record
from perf.target import Target

log = logging.getLogger(__name__)
WINDOWS = 3
WINDOW_STRETCH = 1.2  # perf_analyzer's window lasts 1.2 × --measurement-interval (measured, 2.41.0)
OPEN_TAIL_S = 0.15  # window time after the last arrival, for its response to come back
# The pause the intervals file ends with: perf_analyzer plays the file again from the top when its
# windows outlast it. They did once in runs 1-26 of the tuner: a saturation run (1.3x what the server
# serves) sent 32,657 requests for 24,907 arrivals, the server's lag having stretched the windows.
WRAP_PAUSE_S = OPEN_TAIL_S + 0.5
NO_STABILITY = ("--stability-percentage", "1000000", "--max-trials", str(WINDOWS))
INPUT_ROWS_MAX = 4096  # rows of the input pool written to --input-data (cycled by perf_analyzer)
UNANSWERED = "unanswered: perf_analyzer's measurement windows closed first (overload)"


def unavailable_message() -> str:
    """Why ``--engine perf_analyzer`` cannot run here, and how to fix it."""
    reason = unavailable_reason() or "not installed or does not run"
    return f"perf_analyzer is unavailable ({reason}); install it with `make perf-analyzer`"


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


def records_from_export(
    export: Export, target: Target, label: str, arrivals_s: Sequence[float] | None = None
) -> list[Record]:
    """Our records from perf_analyzer's export; times in seconds from the first window's start.

    With ``arrivals_s`` (an open loop) the export's requests are the first arrivals in send order and
    every arrival the export lacks becomes a failed record at its scheduled time. Requests sent at
    least ``WRAP_PAUSE_S`` after the last arrival are perf_analyzer playing the schedule again (its
    windows outlasted it): they come after every arrival's request and are left out, logged; any
    other surplus is an error.
    """
    start = export.windows_ns[0]
    sent = sum(a[0].nbytes for a in target.inputs.values())  # one row of each input
    received = sum(target.output_row_bytes.values())
    sends = (export.sends_ns - start) / 1e9
    receives = (export.receives_ns - start) / 1e9
    records = [
        Record(target.model, float(s), float(r), 1, sent, received, True, "ok", (float(s),), label)
        for s, r in zip(sends, receives, strict=True)
    ]
    if arrivals_s is not None:
        if len(records) > len(arrivals_s):
            surplus = records[len(arrivals_s) :]
            if surplus[0].send_s < arrivals_s[-1] + WRAP_PAUSE_S - 0.01:
                raise StudyError(
                    f"perf_analyzer sent {len(records)} requests for {len(arrivals_s)} arrivals, the "
                    "surplus before its schedule's closing pause"
                )
            log.warning(
                "%s: perf_analyzer played its schedule again after the pause (windows outlasted it): "
                "%d requests sent after the last arrival left out",
                label,
                len(surplus),
            )
            records = records[: len(arrivals_s)]
        end = (export.windows_ns[-1] - start) / 1e9
        records += [
            Record(target.model, float(a), end, 1, 0, 0, False, UNANSWERED, (float(a),), label)
            for a in arrivals_s[len(records) :]
        ]
    return records


class PerfAnalyzerEngine:
    """perf_analyzer as the load engine (the interface of ``LoadEngine``); use as a context manager."""

    def __init__(self, binary: Path | None = None) -> None:
        found = binary or find_perf_analyzer()
        if found is None:
            raise OptionError(unavailable_message())
        self.binary = found
        version = subprocess.run([str(found), "--version"], capture_output=True, text=True, timeout=60)
        match = re.search(r"Version\s+(\S+)", version.stdout + version.stderr)
        self.version = match.group(1) if match else "unknown version"
        self.last_start = 0.0  # perf_counter of t = 0 of the latest run (records' clock)
        self.last_csv: AnalyzerResult | None = None  # perf_analyzer's own figures of the latest run
        self._folder: tempfile.TemporaryDirectory | None = None
        self._runs = 0

    @property
    def name(self) -> str:
        return f"perf_analyzer {self.version}"

    def __enter__(self) -> PerfAnalyzerEngine:
        self._folder = tempfile.TemporaryDirectory(prefix="pa_engine_")
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._folder is not None:
            self._folder.cleanup()
            self._folder = None

    @property
    def folder(self) -> Path:
        if self._folder is None:
            raise StudyError("PerfAnalyzerEngine is used outside its `with` block")
        return Path(self._folder.name)

    def closed_loop(self, target: Target, concurrency: int, seconds: float, label: str) -> list[Record]:
        """``concurrency`` requests in flight (perf_analyzer's synchronous threads) for about ``seconds``."""
        export = self._run(target, ["--concurrency-range", str(concurrency)], seconds, concurrency)
        return records_from_export(export, target, label)

    def open_loop(self, target: Target, arrivals_s: Sequence[float], label: str) -> list[Record]:
        """One request per arrival time (seconds from the start), sent by perf_analyzer's async client."""
        arrivals = np.asarray(arrivals_s, dtype=float)
        if arrivals.size == 0:
            return []
        span = float(arrivals[-1])
        gaps_us = np.rint(np.diff(np.concatenate([[0.0], arrivals])) * 1e6).astype(np.int64)
        # after the last arrival, a pause longer than the rest of the windows: nothing is sent twice
        pause_us = int(WRAP_PAUSE_S * 1e6)
        intervals = self.folder / "intervals.txt"
        intervals.write_text("\n".join(str(g) for g in [*gaps_us.tolist(), pause_us]) + "\n")
        export = self._run(
            target, ["--async", "--request-intervals", str(intervals)], span + OPEN_TAIL_S, concurrency=0
        )
        return records_from_export(export, target, label, arrivals.tolist())

    def _run(self, target: Target, load: list[str], seconds: float, concurrency: int) -> Export:
        """Run perf_analyzer with ``load`` for three windows covering ``seconds``; its export, and its
        CSV figures in ``last_csv`` (``concurrency`` 0 for an open loop)."""
        if target.collect != 1:
            raise OptionError(f"the perf_analyzer engine sends single samples, not collect={target.collect}")
        self._runs += 1
        folder = self.folder
        csv_path, export_path = folder / f"run{self._runs}.csv", folder / f"run{self._runs}.json"
        rows = min(INPUT_ROWS_MAX, next(iter(target.inputs.values())).shape[0])
        data = write_input_data(target.inputs, folder / "inputs.json", rows=rows if target.cycle else 16)
        window_ms = max(1, int(seconds * 1000 / (WINDOWS * WINDOW_STRETCH)))
        settings = ("--measurement-interval", str(window_ms), *NO_STABILITY)
        command = [
            str(self.binary), "-m", target.model, "-u", target.url, "-i", target.protocol,
            "--input-data", str(data), "--percentile", "99", "-f", str(csv_path),
            "--profile-export-file", str(export_path), *load, *settings,
        ]  # fmt: skip
        if target.shared_memory:
            command += ["--shared-memory", "system"]
        wall_ns, counter = time.time_ns(), time.perf_counter()
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=120 + 3 * seconds)
        except subprocess.TimeoutExpired as error:
            raise StudyError(f"perf_analyzer did not finish in {error.timeout:.0f} s") from error
        if done.returncode != 0 or not export_path.is_file():
            tail = (done.stderr or done.stdout)[-600:].strip()
            raise StudyError(f"perf_analyzer failed ({done.returncode}): {tail}")
        export = Export.read(export_path)
        self.last_start = counter + (export.windows_ns[0] - wall_ns) / 1e9
        self.last_csv = read_analyzer_csv(csv_path, concurrency, settings)
        log.info("perf_analyzer %s: %d requests exported", " ".join(load), export.sends_ns.size)
        return export

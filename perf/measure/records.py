"""One record per request, the only raw data perf keeps, and the figures every table and plot derives
from them. Times are seconds from the start of the measurement; latency counts from each sample's
arrival, so time waiting in the client (for a batch to fill, a free slot) is not hidden. A request
belongs to the span its response arrived in; throughput counts successful samples.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import numpy as np

SHED = "shed"  # the status of arrivals the client dropped because every slot was busy starts with this


@dataclass(slots=True)
class Record:
    model: str
    send_s: float
    recv_s: float
    batch: int  # samples in this request
    bytes_sent: int  # tensor payload sent (inputs)
    bytes_received: int  # tensor payload received (outputs)
    ok: bool
    status: str = "ok"  # "ok", or the error's class and message
    arrivals: tuple[float, ...] = field(default_factory=tuple)  # per sample where they differ, else one
    label: str = ""  # which measurement point (mode, load) produced it
    length: int = 0  # a variable axis' true length (a static batch's mean), 0 for fixed shapes
    sent_length: int = 0  # the length sent at (a bucket's, when padded)

    @property
    def shed(self) -> bool:
        """Arrivals the client never sent (every slot busy): overload, not a server error."""
        return not self.ok and self.status.startswith(SHED)

    def sample_latencies(self) -> np.ndarray:
        """Per-sample latency from each sample's arrival to the response."""
        arrivals = self.arrivals or (self.send_s,)
        if len(arrivals) == 1:
            return np.full(self.batch, self.recv_s - arrivals[0])
        return self.recv_s - np.asarray(arrivals)


def latencies(records: Iterable[Record]) -> np.ndarray:
    """Per-sample latencies (seconds) of the successful records."""
    parts = [r.sample_latencies() for r in records if r.ok]
    return np.concatenate(parts) if parts else np.empty(0)


CSV_FIELDS = [f.name for f in fields(Record)]


def write_csv(records: Sequence[Record], path: Path) -> None:
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, CSV_FIELDS)
        writer.writeheader()
        writer.writerows({**asdict(r), "arrivals": " ".join(f"{a:.6f}" for a in r.arrivals)} for r in records)


def write_json(records: Sequence[Record], path: Path) -> None:
    """Column-wise (one list per field), times rounded to µs: a third of the row-wise size."""
    columns: dict[str, list] = {name: [getattr(r, name) for r in records] for name in CSV_FIELDS}
    for name in ("send_s", "recv_s"):
        columns[name] = [round(t, 6) for t in columns[name]]
    columns["arrivals"] = [[round(a, 6) for a in times] for times in columns["arrivals"]]
    path.write_text(json.dumps(columns, separators=(",", ":")))


@dataclass(frozen=True)
class Summary:
    requests: int  # requests whose outcome fell in the span
    succeeded: int
    failed: int
    samples: int  # successful samples
    seconds: float
    throughput: float  # successful samples per second
    p50_ms: float
    p90_ms: float
    p99_ms: float
    mean_ms: float


def in_span(records: Sequence[Record], start_s: float, end_s: float) -> list[Record]:
    return [r for r in records if start_s <= r.recv_s < end_s]


def summarize(records: Sequence[Record], start_s: float, end_s: float) -> Summary:
    """Summarize the records answered in ``[start_s, end_s)``."""
    chosen = in_span(records, start_s, end_s)
    ok = [r for r in chosen if r.ok]
    lat_ms = latencies(ok) * 1e3
    p50, p90, p99 = np.percentile(lat_ms, [50, 90, 99]) if lat_ms.size else (np.nan, np.nan, np.nan)
    seconds = float(end_s - start_s)
    samples = sum(r.batch for r in ok)
    return Summary(
        requests=len(chosen), succeeded=len(ok), failed=len(chosen) - len(ok), samples=samples,
        seconds=seconds, throughput=samples / seconds if seconds > 0 else 0.0,
        p50_ms=float(p50), p90_ms=float(p90), p99_ms=float(p99),
        mean_ms=float(lat_ms.mean()) if lat_ms.size else float("nan"),
    )  # fmt: skip


def window_is_stable(values: Sequence[float], tolerance: float) -> bool:
    """perf_analyzer's rule (``--stability-percentage``): largest over smallest within ``1 + tolerance``."""
    if not values or any(np.isnan(v) for v in values):
        return False
    smallest = min(values)
    return smallest > 0 and max(values) <= (1 + tolerance) * smallest

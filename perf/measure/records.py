"""One record per request, the only raw data perf keeps: every table and plot is derived from these.
Times are seconds from the start of the measurement; latency counts from each sample's arrival, so
time waiting in the client (for a batch to fill, a free slot) is not hidden.
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
        for record in records:
            writer.writerow({**asdict(record), "arrivals": " ".join(f"{a:.6f}" for a in record.arrivals)})


def write_json(records: Sequence[Record], path: Path) -> None:
    """Column-wise (one list per field), times rounded to µs: a third of the row-wise size."""
    columns: dict[str, list] = {name: [getattr(r, name) for r in records] for name in CSV_FIELDS}
    for name in ("send_s", "recv_s"):
        columns[name] = [round(t, 6) for t in columns[name]]
    columns["arrivals"] = [[round(a, 6) for a in times] for times in columns["arrivals"]]
    path.write_text(json.dumps(columns, separators=(",", ":")))

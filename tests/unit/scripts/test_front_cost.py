"""How ``scripts/front_cost.py --profile`` groups a profile of the gRPC front (docs/SERVING.md, "What the
fronts cost", quotes those shares): a real cProfile of a front function and of a wait in epoll, no
server."""

from __future__ import annotations

import cProfile
import pstats
import selectors
from pathlib import Path

import pytest

from scripts.front_cost import busy_shares
from server.fronts.grpc_wire import parse_timeout


def test_waiting_is_apart_and_the_busy_time_is_shared_out_by_front_module(tmp_path: Path) -> None:
    profiler = cProfile.Profile()
    with selectors.EpollSelector() as selector:
        profiler.enable()
        for _ in range(5000):
            parse_timeout(b"250m")  # its dict.get, isdigit and len count for grpc_wire
        selector.select(0.05)
        profiler.disable()
    profiler.dump_stats(tmp_path / "front.prof")
    (idle, first), *busy = busy_shares(tmp_path / "front.prof")
    assert first.startswith("idle") and 0 < idle < 1
    assert abs(sum(share for share, _ in busy) - 1) < 1e-9
    parts = {part: share for share, part in busy}
    assert set(parts) <= {"grpc_wire.py", "other"}
    stats = pstats.Stats(str(tmp_path / "front.prof")).stats
    own = {key: entry[2] for key, entry in stats.items()}
    waiting = sum(seconds for (_, _, function), seconds in own.items() if "epoll" in function)
    in_wire = sum(seconds for (file, _, _), seconds in own.items() if file.endswith("grpc_wire.py"))
    called_from_wire = sum(
        times[2]
        for (file, _, _), entry in stats.items()
        if file == "~"
        for caller, times in entry[4].items()
        if caller[0].endswith("grpc_wire.py")
    )
    assert called_from_wire > 0
    assert parts["grpc_wire.py"] == pytest.approx(
        (in_wire + called_from_wire) / (sum(own.values()) - waiting)
    )

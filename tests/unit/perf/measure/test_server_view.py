"""Parsing the server's statistics, and differencing snapshots."""

import math
import os

import pytest

from client.stats import parse_model_stats
from perf.measure.server_view import HostCpu, process_tree_cpu_s


def stats_payload(success, executions, inferences, batches):
    return {
        "model_stats": [{
            "name": "m", "version": "1", "inference_count": inferences, "execution_count": executions,
            "inference_stats": {
                "success": {"count": success, "ns": 0}, "fail": {"count": 0, "ns": 0},
                "queue": {"count": success, "ns": 2_000_000 * success},
                "compute_input": {"count": success, "ns": 0},
                "compute_infer": {"count": success, "ns": 3_000_000 * success},
                "compute_output": {"count": success, "ns": 0},
            },
            "batch_stats": [
                {"batch_size": size, "compute_infer": {"count": count, "ns": count * ms * 1_000_000},
                 "compute_input": {"count": count, "ns": 0}, "compute_output": {"count": count, "ns": 0}}
                for size, (count, ms) in batches.items()
            ],
        }]
    }  # fmt: skip


def test_stats_delta_gives_formed_batches_and_means():
    before = parse_model_stats(stats_payload(10, 10, 10, {1: (10, 2)}))
    after = parse_model_stats(stats_payload(50, 15, 50, {1: (12, 2), 8: (2, 5), 16: (1, 7)}))
    delta = after - before
    assert delta.requests == 40 and delta.executions == 5 and delta.inferences == 40
    assert delta.mean_batch == pytest.approx(8.0)
    assert sorted(delta.batches) == [1, 8, 16]
    assert delta.batches[8].executions == 2
    assert delta.compute_ms_at(8) == pytest.approx(5.0)
    assert delta.queue_ms_per_request == pytest.approx(2.0)
    assert delta.compute_ms_per_request == pytest.approx(3.0)


def test_process_cpu_reads_proc():
    sum(i * i for i in range(200_000))  # make sure this process has used some CPU
    assert process_tree_cpu_s(os.getpid()) > 0


def test_proc_stat_reads_busy_and_stolen_time_apart() -> None:
    now = HostCpu.now()
    assert now is not None and 0 < now.busy <= now.total and 0 <= now.stolen <= now.total
    # the hypervisor took 50 of 1,000 jiffies: 5% stolen, and not counted as this machine's work
    before, after = HostCpu(100, 1000, 10), HostCpu(600, 2000, 60)
    busy, stolen = after.since(before)
    assert stolen == pytest.approx(0.05)
    assert 0 < busy <= os.cpu_count()
    assert all(math.isnan(x) for x in now.since(None))
    assert all(math.isnan(x) for x in now.since(now))  # no time passed: no figure, not a 0

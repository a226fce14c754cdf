"""What the watchdog reads from Triton's metrics to tell a stuck model from an idle or a busy one."""

from __future__ import annotations

import os

from server.launcher import free_ports
from server.watchdog import Watchdog, model_progress

METRICS = """# HELP nv_inference_request_success Number of successful inference requests
nv_inference_request_success{model="sleepy",version="1"} 5
nv_inference_request_success{model="sleepy",version="2"} 1
nv_inference_request_failure{model="sleepy",reason="BACKEND",version="1"} 4
nv_inference_request_failure{model="sleepy",reason="REJECTED",version="1"} 0
nv_inference_exec_count{model="sleepy",version="1"} 7
nv_inference_pending_request_count{model="sleepy",version="1"} 3
nv_inference_pending_request_count{model="idle",version="1"} 0
nv_inference_exec_count{model="idle",version="1"} 12
nv_inference_queue_duration_us{model="sleepy",version="1"} 123456
nv_gpu_utilization{gpu_uuid="GPU-0"} 0.5
"""


def test_progress_sums_executions_successes_and_failures_over_versions_and_reasons() -> None:
    progress = model_progress(METRICS)
    assert progress == {"sleepy": (3.0, 5 + 1 + 4 + 7), "idle": (0.0, 12.0)}


def test_no_metrics_no_models() -> None:
    assert model_progress("") == {}
    assert model_progress('# only comments\nnv_gpu_utilization{gpu_uuid="GPU-0"} 1\n') == {}


def test_metrics_that_cannot_be_read_judge_no_model_stuck() -> None:
    """A metrics port that refuses (the server restarting, say) is no evidence: nothing is stuck."""
    (port,) = free_ports(["127.0.0.1"])
    watchdog = Watchdog(
        os.getpid(), "127.0.0.1:1", "key", None, metrics_url=f"http://127.0.0.1:{port}/metrics"
    )
    assert watchdog.stuck_models([]) == {}

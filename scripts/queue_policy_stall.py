"""Reproduce the queue-policy stall of Triton 2.51 and its workaround (docs/SERVING.md, "Row 11: the
queue-policy stall").

Builds ``trivial`` several ways (no policy; ``max_queue_size: 512`` with a 100 µs and a 0 µs batcher
delay; the policy with 2, 3 and 4 instances), serves them on one embedded tritonserver, and drives each
with a closed loop of gRPC clients, back to back and with a short think time between a response and the
next request. Prints p99, max latency and the requests over 300 ms. Not a test: a measurement to repeat
on another Triton release (``TRITONSERVER=/path/to/tritonserver``) or with other server options
(``--server-arg=--rate-limit=execution_count``). ``--models`` picks some of them.

    .venv/bin/python scripts/queue_policy_stall.py [--seconds 8] [--clients 16] [--think-ms 0 2]
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient

from exporters.repository import build_repository
from exporters.schema.models import parse_spec
from server import ServerOptions, TritonServer

TRIVIAL = {
    "source": "trivial", "options": {"features": 16}, "max_batch_size": 64,
    "inputs": [{"name": "x", "dtype": "fp32", "shape": [16]}],
    "outputs": [{"name": "y", "dtype": "fp32", "shape": [16]}],
}  # fmt: skip
POLICY = {"max_queue_size": 512}
# name -> (batching, instances)
MODELS: dict[str, tuple[dict, int]] = {
    "no_policy": ({"mode": "dynamic", "max_queue_delay_us": 100}, 1),
    "max_queue_size_512": ({"mode": "dynamic", "max_queue_delay_us": 100, "queue": POLICY}, 1),
    "policy_delay_0": ({"mode": "dynamic", "max_queue_delay_us": 0, "queue": POLICY}, 1),
    "policy_2_instances": ({"mode": "dynamic", "max_queue_delay_us": 100, "queue": POLICY}, 2),
    "policy_3_instances": ({"mode": "dynamic", "max_queue_delay_us": 100, "queue": POLICY}, 3),
    "policy_4_instances": ({"mode": "dynamic", "max_queue_delay_us": 100, "queue": POLICY}, 4),
}


def closed_loop(url: str, model: str, seconds: float, clients: int, think_s: float) -> np.ndarray:
    """Latencies (ms) of ``clients`` threads each sending one request after the other."""
    latencies: list[float] = []
    lock = threading.Lock()

    def client() -> None:
        connection = grpcclient.InferenceServerClient(url)
        x = grpcclient.InferInput("x", [1, 16], "FP32")
        x.set_data_from_numpy(np.ones((1, 16), np.float32))
        mine, end = [], time.monotonic() + seconds
        while time.monotonic() < end:
            start = time.monotonic()
            connection.infer(model, [x])
            mine.append((time.monotonic() - start) * 1000)
            if think_s:
                time.sleep(think_s)
        with lock:
            latencies.extend(mine)

    threads = [threading.Thread(target=client) for _ in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return np.array(latencies)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--think-ms", type=float, nargs="+", default=[0, 2], help="gaps to measure")
    parser.add_argument("--server-arg", action="append", default=[], help="extra tritonserver argument")
    parser.add_argument("--models", nargs="+", choices=list(MODELS), default=list(MODELS))
    args = parser.parse_args()
    entries = [
        {**TRIVIAL, "name": name, "batching": MODELS[name][0], "instances": {"cpu": MODELS[name][1]}}
        for name in args.models
    ]
    spec = parse_spec({"models": entries})
    with tempfile.TemporaryDirectory() as folder:
        build_repository(spec, Path(folder), num_gpus=0)
        with TritonServer(ServerOptions(repository=Path(folder), extra_args=args.server_arg)) as server:
            print(f"{'model':20} {'think':>6} {'requests':>9} {'p99 ms':>7} {'max ms':>7} {'>300 ms':>8}")
            for think_ms in args.think_ms:
                for model in args.models:
                    ms = closed_loop(server.grpc_url, model, args.seconds, args.clients, think_ms / 1000)
                    print(
                        f"{model:20} {think_ms:>4} ms {len(ms):>9} {np.percentile(ms, 99):>7.1f} "
                        f"{ms.max():>7.1f} {int((ms > 300).sum()):>8}"
                    )


if __name__ == "__main__":
    main()

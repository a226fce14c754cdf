"""``python -m client metadata`` against the fault matrix's server, through the fronts as ``make serve``
runs them: the command a user runs to see what a served model takes and gives.

Each run is the CLI itself (a subprocess, as a user types it); what it prints is compared with the
model's ``config.pbtxt`` in the served repository (names, datatypes, and the dims with the batch axis
Triton adds where ``max_batch_size`` > 0), so a metadata that names other tensors, or a CLI that prints
the wrong object, fails.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import tritonclient.http as httpclient
from harness import PROTOCOLS, url
from resilience_fixtures import ROOT, tree_environment
from tritonclient.grpc import model_config_pb2

from exporters.configs.model_config import read_config
from server import TritonServer

pytestmark = pytest.mark.integration
MODEL = "recommender"  # several inputs, of more than one datatype
HANG_GUARD_S = 120


def _metadata_cli(server: TritonServer, protocol: str, *args: str) -> dict:
    """What ``python -m client --protocol P --url U metadata ARGS`` prints, parsed; it must exit 0."""
    command = [sys.executable, "-m", "client", "--protocol", protocol, "--url", url(server, protocol)]
    run = subprocess.run(
        [*command, "metadata", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=tree_environment(),
        timeout=HANG_GUARD_S,
    )
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout)


def _tensors(entries: list[dict]) -> list[tuple[str, str, list[int]]]:
    """(name, datatype, shape) of each tensor the CLI printed (gRPC's JSON spells int64 as strings)."""
    return [(e["name"], e["datatype"], [int(d) for d in e["shape"]]) for e in entries]


def _configured(tensors, batched: bool) -> list[tuple[str, str, list[int]]]:
    """(name, datatype, shape) of each tensor the config declares, as Triton's metadata names them."""
    batch = [-1] if batched else []
    named = []
    for tensor in tensors:
        datatype = model_config_pb2.DataType.Name(tensor.data_type).removeprefix("TYPE_")
        named.append((tensor.name, "BYTES" if datatype == "STRING" else datatype, batch + list(tensor.dims)))
    return named


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_metadata_of_a_model_is_its_config(
    fault_server: TritonServer, fault_repository: Path, protocol: str
) -> None:
    config = read_config(fault_repository / MODEL / "config.pbtxt")
    printed = _metadata_cli(fault_server, protocol, "--model", MODEL)
    batched = config.max_batch_size > 0
    assert printed["name"] == MODEL
    assert _tensors(printed["inputs"]) == _configured(config.input, batched)
    assert _tensors(printed["outputs"]) == _configured(config.output, batched)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_metadata_without_a_model_is_the_servers(fault_server: TritonServer, protocol: str) -> None:
    printed = _metadata_cli(fault_server, protocol)
    served = httpclient.InferenceServerClient(fault_server.http_url).get_server_metadata()
    assert printed["name"] == served["name"] == "triton"
    assert (printed["version"], sorted(printed["extensions"])) == (
        served["version"],
        sorted(served["extensions"]),
    )
    assert "inputs" not in printed

"""The compose file, the Dockerfile and the GPU entrypoint, checked here without Docker or a GPU.

No Docker engine runs on this machine, so compose and the Dockerfile are checked as text: they parse,
name only pinned images, mount files that exist, keep the GPU memory headroom and the drain timeout.
The GPU entrypoint script is run for real, with stand-ins for ``nvidia-smi`` (so it sees N GPUs) and
``tritonserver`` (which prints the arguments it was given).
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
import yaml
from deploy_tools import DEPLOY, K8S, ROOT

COMPOSE = DEPLOY / "compose" / "compose.yaml"
ENTRYPOINT = K8S / "overlays" / "gpu" / "tritonserver-gpu.sh"
PINNED = re.compile(r"^[\w.\-/]+:(v?\d+[\w.\-]*)$")  # a tag that starts with a version, never latest


def _seconds(duration: str) -> int:
    match = re.fullmatch(r"(\d+)s", duration)
    assert match, f"unexpected duration {duration}"
    return int(match.group(1))


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


def test_compose_pins_every_image(compose: dict) -> None:
    services = compose["services"]
    assert set(services) == {"triton", "dcgm-exporter", "prometheus", "grafana"}
    for name, service in services.items():
        assert PINNED.match(service["image"]), f"{name}: {service['image']} is not pinned to a version"


def test_compose_triton_reserves_gpus_keeps_headroom_and_drains(compose: dict) -> None:
    triton = compose["services"]["triton"]
    devices = triton["deploy"]["resources"]["reservations"]["devices"]
    assert devices[0]["capabilities"] == ["gpu"] and devices[0]["driver"] == "nvidia"
    assert compose["services"]["dcgm-exporter"]["deploy"]["resources"]["reservations"]["devices"]
    # The entrypoint (shared with Kubernetes) sets --model-load-gpu-limit=<gpu>:0.8 per GPU.
    script_mount = next(v for v in triton["volumes"] if v.endswith("tritonserver-gpu.sh:ro"))
    assert (COMPOSE.parent / script_mount.split(":")[0]).resolve() == ENTRYPOINT
    assert triton["command"][-1] == script_mount.split(":")[1]
    assert _seconds(triton["stop_grace_period"]) > int(triton["environment"]["EXIT_TIMEOUT_SECS"])
    assert all(p.startswith("127.0.0.1:") for p in triton["ports"])


def test_compose_mounts_exist_and_prometheus_reads_the_project_rules(compose: dict) -> None:
    for name, service in compose["services"].items():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("."):
                path = (COMPOSE.parent / source).resolve()
                if "deploy-repository" in source:  # built on the host by `make deploy-repo`
                    assert path.parent.parent == ROOT
                    continue
                assert path.exists(), f"{name}: {source} does not exist"
    prometheus = compose["services"]["prometheus"]
    assert "../monitoring/rules:/etc/prometheus/rules:ro" in prometheus["volumes"]
    grafana = compose["services"]["grafana"]
    provider = yaml.safe_load(
        (COMPOSE.parent / "grafana" / "provisioning" / "dashboards" / "triton.yaml").read_text()
    )
    dashboards_path = provider["providers"][0]["options"]["path"]
    assert f"../monitoring/grafana:{dashboards_path}:ro" in grafana["volumes"]


def test_dockerfile_builds_from_the_project_install() -> None:
    text = (DEPLOY / "Dockerfile").read_text()
    base = re.search(r"^FROM (\S+)", text, re.M).group(1)
    assert PINNED.match(base), f"base image {base} is not pinned"
    for source in re.findall(r"^COPY (\S+) ", text, re.M):
        assert (ROOT / source).exists(), f"COPY {source}: no such path"
    assert "pip install" in text and "torch==" not in text, "torch's pin lives in pyproject.toml only"
    assert 'ENTRYPOINT ["python", "-m", "server.container"]' in text
    assert set(re.search(r"^EXPOSE (.+)$", text, re.M).group(1).split()) == {"8000", "8001", "8002", "8003"}


def _fake_bin(tmp_path: Path, gpus: int) -> dict[str, str]:
    """PATH with an ``nvidia-smi`` that lists ``gpus`` GPUs and a ``tritonserver`` that echoes its args."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    lines = "".join(f'echo "GPU {i}: NVIDIA H100 (UUID: GPU-{i})"\n' for i in range(gpus))
    (bin_dir / "nvidia-smi").write_text(f"#!/bin/sh\n{lines}")
    (bin_dir / "tritonserver").write_text('#!/bin/sh\nfor a in "$@"; do echo "$a"; done\n')
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    return {"PATH": f"{bin_dir}:{os.environ['PATH']}"}


def test_gpu_entrypoint_sets_a_load_limit_per_gpu(tmp_path: Path) -> None:
    env = {**_fake_bin(tmp_path, 3), "GPUS": "3", "EXIT_TIMEOUT_SECS": "30"}
    out = subprocess.run(["sh", str(ENTRYPOINT), "--log-info=true"], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    args = out.stdout.split()
    assert [a for a in args if a.startswith("--model-load-gpu-limit")] == [
        f"--model-load-gpu-limit={g}:0.8" for g in range(3)
    ]
    assert "--exit-timeout-secs=30" in args and "--metrics-config=summary_latencies=true" in args
    assert "--model-repository=/models" in args and "--log-info=true" in args


def test_gpu_entrypoint_refuses_a_gpu_count_the_repository_was_not_built_for(tmp_path: Path) -> None:
    env = {**_fake_bin(tmp_path, 2), "GPUS": "4"}
    out = subprocess.run(["sh", str(ENTRYPOINT)], env=env, capture_output=True, text=True)
    assert out.returncode == 1
    assert "built for GPUS=4 but this container sees 2 GPU(s)" in out.stderr


def test_gpu_entrypoint_without_gpus_uses_every_visible_gpu(tmp_path: Path) -> None:
    out = subprocess.run(["sh", str(ENTRYPOINT)], env=_fake_bin(tmp_path, 2), capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("--model-load-gpu-limit=") == 2

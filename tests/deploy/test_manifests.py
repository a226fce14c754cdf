"""Every Kubernetes manifest renders with ``kubectl kustomize`` and validates; the pieces agree.

Built-in kinds are validated with ``kubernetes-validate --strict`` against the schema of
``KUBERNETES_VERSION``. CRD-based objects (ServiceMonitor, PrometheusRule, InferenceService) have no
schema in kubernetes-validate, and their published CRDs are not packaged in any registry this project
installs from, so they are checked for the fields their published CRD schemas mark required
(prometheus-operator monitoring.coreos.com/v1, KServe serving.kserve.io/v1beta1) plus the fields this
deployment relies on. The Prometheus Adapter rules are a Helm values file, checked for the fields the
adapter's config requires here, and evaluated against a real Prometheus in test_prometheus.py.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from deploy_tools import (
    DEPLOY,
    K8S,
    KUBERNETES_VERSION,
    OVERLAYS,
    ROOT,
    container,
    env_file,
    find,
    render,
    rule_groups,
)

from exporters.configs.models import build_model_config
from exporters.resolve import load_spec

# apiVersion/kind → dotted paths the published CRD schema marks required (and that must not be empty).
CRD_REQUIRED: dict[tuple[str, str], list[str]] = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"): ["spec", "spec.selector"],
    ("monitoring.coreos.com/v1", "PrometheusRule"): ["spec"],
    ("serving.kserve.io/v1beta1", "InferenceService"): [
        "spec.predictor",
        "spec.predictor.model.modelFormat.name",
    ],
}


def _get(obj: dict[str, Any], dotted: str) -> Any:
    for part in dotted.split("."):
        if not isinstance(obj, dict) or part not in obj:
            return None
        obj = obj[part]
    return obj


@pytest.fixture(scope="module", params=OVERLAYS)
def rendered(request: pytest.FixtureRequest) -> tuple[str, list[dict[str, Any]]]:
    return request.param, render(request.param)


@pytest.fixture(scope="module")
def gpu_objects() -> list[dict[str, Any]]:
    return render("overlays/gpu")


def test_every_object_validates(rendered: tuple[str, list[dict[str, Any]]]) -> None:
    overlay, objects = rendered
    assert objects, f"{overlay} rendered nothing"
    for obj in objects:
        key = (obj["apiVersion"], obj["kind"])
        where = f"{overlay}: {obj['kind']}/{obj['metadata']['name']}"
        if key in CRD_REQUIRED:
            for path in CRD_REQUIRED[key]:
                assert _get(obj, path), f"{where}: {path} is required by the CRD schema"
            continue
        try:
            kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.ValidationError as error:
            pytest.fail(f"{where}: {error.message} at {'/'.join(map(str, error.path))}")
        except kubernetes_validate.SchemaNotFoundError:
            pytest.fail(f"{where}: neither a Kubernetes {KUBERNETES_VERSION} kind nor a CRD checked here")


def test_validation_rejects_a_broken_object(gpu_objects: list[dict[str, Any]]) -> None:
    """The strict validator is really applied: a misspelt field fails it."""
    deployment = find(gpu_objects, "Deployment", "triton")
    broken = yaml.safe_load(yaml.safe_dump(deployment))
    broken["spec"]["template"]["spec"]["terminationGracePeriod"] = 60
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBERNETES_VERSION, strict=True)


# (path, port) of the readiness, startup and liveness probes. Our image's supervisor answers its own
# (server.container: not ready while a stub is dead or hung or the server restarts); the NGC image only
# has Triton's.
PROBES = {
    "overlays/cpu": (("/ready", "probes"), ("/ready", "probes"), ("/live", "probes")),
    "overlays/gpu": (("/v2/health/ready", "http"), ("/v2/health/ready", "http"), ("/v2/health/live", "http")),
}


@pytest.mark.parametrize("overlay", ["overlays/cpu", "overlays/gpu"])
def test_deployment_probes_drain_and_repository(overlay: str) -> None:
    objects = render(overlay)
    deployment = find(objects, "Deployment", "triton")
    pod = deployment["spec"]["template"]["spec"]
    server = container(deployment)
    probes = [server[p]["httpGet"] for p in ("readinessProbe", "startupProbe", "livenessProbe")]
    assert [(p["path"], p["port"]) for p in probes] == list(PROBES[overlay])
    assert {p["port"] for p in probes} <= {port["name"] for port in server["ports"]}
    startup = server["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 300, "model loading needs minutes"
    # Grace period > preStop pause + Triton's exit timeout, or SIGKILL cuts in-flight requests.
    settings = find(objects, "ConfigMap", "triton-settings")["data"]
    pause = int(server["lifecycle"]["preStop"]["exec"]["command"][-1])
    assert pod["terminationGracePeriodSeconds"] > pause + int(settings["EXIT_TIMEOUT_SECS"])
    exit_env = next(e for e in server["env"] if e["name"] == "EXIT_TIMEOUT_SECS")
    assert exit_env["valueFrom"]["configMapKeyRef"]["name"].startswith("triton-settings")
    assert deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    assert server["resources"]["requests"] and server["resources"]["limits"]
    # The init container fills the volume the server reads its repository from.
    init = pod["initContainers"][0]
    init_mount = next(m for m in init["volumeMounts"] if m["mountPath"] == "/models")
    server_mount = next(m for m in server["volumeMounts"] if m["mountPath"] == "/models")
    assert init_mount["name"] == server_mount["name"] and server_mount["readOnly"]
    assert "$(MODEL_REPOSITORY_URI)" in init["args"] and settings["MODEL_REPOSITORY_URI"]
    # Service ports are the container's ports; the ServiceMonitor scrapes one of them.
    service = find(objects, "Service", "triton")
    ports = {p["name"] for p in server["ports"]}
    assert {p["targetPort"] for p in service["spec"]["ports"]} <= ports
    monitor = find(objects, "ServiceMonitor", "triton")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert {e["port"] for e in monitor["spec"]["endpoints"]} <= {p["name"] for p in service["spec"]["ports"]}
    # Images are pinned.
    for image in [c["image"] for c in pod["containers"] + pod["initContainers"]]:
        assert re.search(r":[^:]*\d", image) and not image.endswith(":latest"), f"{image} is not pinned"


def test_pdb_and_hpa_select_the_deployment(gpu_objects: list[dict[str, Any]]) -> None:
    deployment = find(gpu_objects, "Deployment", "triton")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    pdb = find(gpu_objects, "PodDisruptionBudget", "triton")
    assert pdb["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    hpa = find(gpu_objects, "HorizontalPodAutoscaler", "triton")
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "triton"}
    assert hpa["spec"]["minReplicas"] >= 2, "one replica cannot roll out or drain without a gap"


def test_hpa_metrics_come_from_the_adapter_rules(gpu_objects: list[dict[str, Any]]) -> None:
    """Every metric the HPA reads is one the adapter provides; each rule has what the adapter needs."""
    values = yaml.safe_load((K8S / "prometheus-adapter" / "values.yaml").read_text())
    rules = values["rules"]["custom"]
    provided = set()
    for rule in rules:
        assert {"seriesQuery", "resources", "name", "metricsQuery"} <= rule.keys()
        assert rule["resources"]["overrides"]["pod"] == {"resource": "pod"}
        assert rule["resources"]["overrides"]["namespace"] == {"resource": "namespace"}
        assert "<<.LabelMatchers>>" in rule["metricsQuery"] and "<<.GroupBy>>" in rule["metricsQuery"]
        provided.add(rule["name"]["as"])
    hpa = find(gpu_objects, "HorizontalPodAutoscaler", "triton")
    wanted = {m["pods"]["metric"]["name"] for m in hpa["spec"]["metrics"] if m["type"] == "Pods"}
    assert wanted and wanted <= provided


def test_hpa_queue_target_exceeds_every_batching_delay(gpu_objects: list[dict[str, Any]]) -> None:
    """The batcher waits up to max_queue_delay_us on purpose; a lower target would scale an idle fleet."""
    hpa = find(gpu_objects, "HorizontalPodAutoscaler", "triton")
    target = next(
        float(m["pods"]["target"]["averageValue"])
        for m in hpa["spec"]["metrics"]
        if m["pods"]["metric"]["name"] == "triton_queue_time_us_per_request"
    )
    delays = [m.batching.max_queue_delay_us for m in load_spec(ROOT / "models.yaml").models]
    assert target > max(delays)


def _gpu_count_everywhere(root: Path) -> dict[str, Any]:
    """GPU counts as each consumer sees them, rendered from ``root`` (a copy of deploy/k8s)."""
    gpu = render("overlays/gpu", root)
    server = container(find(gpu, "Deployment", "triton"))
    kserve = find(render("kserve", root), "InferenceService")
    model = kserve["spec"]["predictor"]["model"]
    return {
        "configmap": find(gpu, "ConfigMap", "triton-gpus")["data"]["GPUS"],
        "gpu_request": server["resources"]["requests"]["nvidia.com/gpu"],
        "gpu_limit": server["resources"]["limits"]["nvidia.com/gpu"],
        "env": next(e for e in server["env"] if e["name"] == "GPUS")["valueFrom"]["configMapKeyRef"]["name"],
        "kserve_limit": model["resources"]["limits"]["nvidia.com/gpu"],
        "kserve_load_limits": sorted(
            int(a.split("=")[1].split(":")[0])
            for a in model["args"]
            if a.startswith("--model-load-gpu-limit")
        ),
    }


def test_gpu_count_comes_from_gpus_env_and_matches_the_instance_groups() -> None:
    gpus = int(env_file(K8S / "gpus" / "gpus.env")["GPUS"])
    seen = _gpu_count_everywhere(K8S)
    assert int(seen["configmap"]) == gpus
    assert int(seen["gpu_request"]) == int(seen["gpu_limit"]) == int(seen["kserve_limit"]) == gpus
    assert seen["env"].startswith("triton-gpus")
    assert seen["kserve_load_limits"] == list(range(gpus)), "one --model-load-gpu-limit per GPU"
    # `make deploy-repo` builds with the same N ...
    dry = subprocess.run(["make", "-n", "deploy-repo"], cwd=ROOT, capture_output=True, text=True, check=True)
    assert f"--gpus {gpus} " in dry.stdout
    # ... and with N GPUs every GPU-placed model gets instance groups on exactly GPUs 0..N-1.
    for spec in load_spec(ROOT / "models.yaml").models:
        groups = build_model_config(spec, gpus).instance_group
        used = sorted({g for group in groups if group.kind == "KIND_GPU" for g in group.gpus})
        if spec.instances.gpus == "all" and spec.target != "cpu":
            assert used == list(range(gpus)), f"{spec.name}: instance groups on GPUs {used}, pod has {gpus}"
        assert all(g < gpus for g in used), f"{spec.name}: GPU {max(used)} is not in the pod"


def test_changing_gpus_env_changes_every_gpu_request(tmp_path: Path) -> None:
    """The count is copied, not repeated: edit gpus.env alone and the overlays follow."""
    shutil.copytree(K8S, tmp_path / "k8s")
    (tmp_path / "k8s" / "gpus" / "gpus.env").write_text("GPUS=3\n")
    seen = _gpu_count_everywhere(tmp_path / "k8s")
    assert seen["configmap"] == "3"
    assert int(seen["gpu_request"]) == int(seen["gpu_limit"]) == int(seen["kserve_limit"]) == 3


def test_prometheus_rule_object_carries_the_rule_files(gpu_objects: list[dict[str, Any]]) -> None:
    rule = find(gpu_objects, "PrometheusRule", "triton")
    assert rule["spec"]["groups"] == rule_groups()
    for group in rule["spec"]["groups"]:
        for item in group["rules"]:
            assert item["expr"] and (("record" in item) != ("alert" in item)), item


def test_generated_files_are_current() -> None:
    result = subprocess.run(
        [sys.executable, str(DEPLOY / "monitoring" / "generate.py"), "--check"],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_kserve_variant_drains_and_uses_the_triton_runtime() -> None:
    service = find(render("kserve"), "InferenceService")
    predictor = service["spec"]["predictor"]
    assert predictor["model"]["modelFormat"]["name"] == "triton"
    assert predictor["model"]["storageUri"].split("://")[0] in {"s3", "gs", "azure", "pvc", "https"}
    exit_timeout = next(
        int(a.split("=")[1]) for a in predictor["model"]["args"] if a.startswith("--exit-timeout-secs")
    )
    assert predictor["terminationGracePeriodSeconds"] > exit_timeout

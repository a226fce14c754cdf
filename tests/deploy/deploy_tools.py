"""What the deployment tests share: where the tools are, rendering an overlay, the rule files.

The tools come from ``make deploy-tools`` (deploy/install-tools.sh): prometheus/promtool from Debian's
package unpacked into ``.venv/prometheus`` unless they are on PATH, kubectl from PATH or the venv.
A test that lacks one skips with the reason and the command that installs it; nothing skips silently.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "k8s"
MONITORING = DEPLOY / "monitoring"
RULE_FILES = [MONITORING / "rules" / "recording.rules.yml", MONITORING / "rules" / "alerts.rules.yml"]
# Every rendered object is validated against this Kubernetes version's schema (strict).
KUBERNETES_VERSION = "1.32.0"
OVERLAYS = ["overlays/cpu", "overlays/gpu", "kserve"]


def tool(name: str) -> str:
    """Path of ``name`` (PATH first, then what deploy/install-tools.sh put in the venv), or skip."""
    venv = Path(sys.prefix)
    for candidate in (shutil.which(name), venv / "prometheus" / "usr" / "bin" / name, venv / "bin" / name):
        if candidate and Path(candidate).is_file():
            return str(candidate)
    pytest.skip(f"{name} is not installed and `make deploy-tools` could not install it (see its output)")


def render(overlay: str | Path, root: Path = K8S) -> list[dict[str, Any]]:
    """``kubectl kustomize`` of one overlay, as a list of objects."""
    result = subprocess.run(
        [tool("kubectl"), "kustomize", str(root / overlay)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, f"kubectl kustomize {overlay} failed:\n{result.stderr}"
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def find(objects: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    """The one object of ``kind`` named ``name`` (generated ConfigMaps carry a hash suffix)."""
    pattern = re.compile(rf"{re.escape(name or '')}(-[a-z0-9]{{10}})?$" if name else ".*")
    matches = [o for o in objects if o["kind"] == kind and pattern.match(o["metadata"]["name"])]
    assert len(matches) == 1, (
        f"expected one {kind} {name or ''}, found {[m['metadata']['name'] for m in matches]}"
    )
    return matches[0]


def container(deployment: dict[str, Any], name: str = "tritonserver") -> dict[str, Any]:
    return next(c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == name)


def rule_groups() -> list[dict[str, Any]]:
    groups: list[dict[str, Any]] = []
    for path in RULE_FILES:
        groups += yaml.safe_load(path.read_text())["groups"]
    return groups


def env_file(path: Path) -> dict[str, str]:
    """A kustomize ``envs:`` file as a dict (comments and blank lines skipped)."""
    pairs = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            pairs[key] = value
    return pairs

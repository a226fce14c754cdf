"""The monitoring files pass Prometheus's own checker, and every alert has a passing promtool unit test.

``promtool`` is Debian's prometheus 2.42 (``make deploy-tools``). The dashboard is checked to read only
series the rules record or the exporters export.
"""

from __future__ import annotations

import json
import re
import subprocess

import yaml
from deploy_tools import MONITORING, RULE_FILES, rule_groups, tool


def _promtool(*args: str) -> str:
    result = subprocess.run([tool("promtool"), *args], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, f"promtool {' '.join(args)}:\n{result.stdout}\n{result.stderr}"
    return result.stdout


def test_promtool_checks_the_scrape_config_and_its_rules() -> None:
    out = _promtool("check", "config", str(MONITORING / "prometheus.yml"))
    assert "2 rule files found" in out


def test_promtool_checks_the_rules() -> None:
    _promtool("check", "rules", *map(str, RULE_FILES))


def test_every_alert_has_a_unit_test_and_they_pass() -> None:
    tests_file = MONITORING / "tests" / "alerts.test.yml"
    alerts = {r["alert"] for g in rule_groups() for r in g["rules"] if "alert" in r}
    tested = {
        case["alertname"]
        for test in yaml.safe_load(tests_file.read_text())["tests"]
        for case in test.get("alert_rule_test", [])
        if case.get("exp_alerts")
    }
    assert alerts == tested, f"alerts without a firing test: {alerts - tested}"
    assert "SUCCESS" in _promtool("test", "rules", str(tests_file))


def test_promtool_unit_tests_can_fail(tmp_path) -> None:
    """A wrong expectation fails promtool: the suite above is not vacuous."""
    source = (MONITORING / "tests" / "alerts.test.yml").read_text()
    broken = source.replace("../rules/", str(MONITORING / "rules") + "/").replace("87.5%", "70%")
    (tmp_path / "broken.test.yml").write_text(broken)
    result = subprocess.run(
        [tool("promtool"), "test", "rules", str(tmp_path / "broken.test.yml")], capture_output=True, text=True
    )
    assert result.returncode != 0 and "GpuMemoryHeadroomLow" in result.stdout + result.stderr


def test_dashboard_reads_only_recorded_or_exported_series() -> None:
    board = json.loads((MONITORING / "grafana" / "triton-dashboard.json").read_text())
    recorded = {r["record"] for g in rule_groups() for r in g["rules"] if "record" in r}
    exported = {"up", "DCGM_FI_DEV_GPU_UTIL", "nv_inference_count"}
    titles = [p["title"] for p in board["panels"]]
    for wanted in (
        "Throughput",
        "p50 / p99",
        "Queue vs compute",
        "batch size",
        "Failures",
        "GPU utilisation",
    ):
        assert any(wanted in t for t in titles), f"no panel for {wanted}"
    assert any("GPU memory" in t for t in titles)
    for panel in board["panels"]:
        for target in panel["targets"]:
            names = set(re.findall(r"[a-zA-Z_:][a-zA-Z0-9_:]*(?=\{|\)|\s*$| ==)", target["expr"]))
            names -= {"by", "sum", "avg", "count", "max", "model"}
            assert names <= recorded | exported, (
                f"{panel['title']}: unknown series {names - recorded - exported}"
            )

"""The Makefile's own messages: what a target needs is named as the make variable a user types."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
STAMPS = (".venv/.installed", ".venv/perf_analyzer/.attempted", ".venv/bubblewrap/.attempted")
BUILT = [option for stamp in STAMPS for option in ("-o", stamp)]  # setup taken as done


def dry_run(*arguments: str) -> subprocess.CompletedProcess:
    """``make -n``: the recipe expanded, nothing run."""
    return subprocess.run(["make", "-n", *BUILT, *arguments], cwd=ROOT, capture_output=True, text=True)


@pytest.mark.parametrize("target", ["tune", "plan"])
@pytest.mark.parametrize(
    "given", [["P99_MS=10"], ["MODEL=recommender"], []], ids=["no model", "no budget", "neither"]
)
def test_tune_and_plan_without_a_model_or_a_budget_name_both_variables(target: str, given: list[str]) -> None:
    done = dry_run(target, *given)
    assert done.returncode == 2
    example = f"(e.g. make {target} MODEL=recommender P99_MS=10)"
    assert f"make {target} needs MODEL= and P99_MS= {example}" in done.stderr
    assert "--model" not in done.stderr and "python" not in done.stdout


@pytest.mark.parametrize("target", ["tune", "plan"])
def test_tune_and_plan_with_both_run_the_python_command(target: str) -> None:
    done = dry_run(target, "MODEL=recommender", "P99_MS=10")
    assert done.returncode == 0, done.stderr
    assert f"-m perf {target} --spec models.yaml --model recommender --p99-ms 10" in done.stdout

"""Shared test fixtures: the project's spec, plus helpers to build repositories into tmp folders."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def spec_data() -> dict[str, Any]:
    """``models.yaml`` as a dict; tests extend copies of it with test-only models."""
    return yaml.safe_load((ROOT / "models.yaml").read_text())

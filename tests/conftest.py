"""Shared test fixtures: the project's spec, plus helpers to build repositories into tmp folders."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from exporters.spec import ModelSpec, parse_spec

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def spec_data() -> dict[str, Any]:
    """``models.yaml`` as a dict; tests extend copies of it with test-only models."""
    return yaml.safe_load((ROOT / "models.yaml").read_text())


@pytest.fixture(scope="session")
def model_spec(spec_data: dict[str, Any]) -> Callable[..., ModelSpec]:
    """``model_spec(name, **changes)``: one model of ``models.yaml`` with fields replaced, validated."""

    def make(name: str, **changes: Any) -> ModelSpec:
        data = copy.deepcopy(spec_data)
        next(m for m in data["models"] if m["name"] == name).update(changes)
        return parse_spec(data).model(name)

    return make

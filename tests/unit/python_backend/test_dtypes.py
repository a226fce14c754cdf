"""The one dtype table (``python_backend.dtypes``): each entry's Triton type is one
``model_config.proto`` knows, its numpy and torch types hold as many bytes as it says, bf16 stays
between torch stages, and the table imports without numpy or torch (the stub's folder and the client
read it)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from tritonclient.grpc import model_config_pb2
from tritonclient.utils import np_to_triton_dtype

from python_backend.dtypes import BY_TRITON, DTYPES, INTEGER_DTYPES, MODEL_DTYPES

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize("key", sorted(DTYPES))
def test_each_triton_type_is_one_the_config_schema_knows(key: str) -> None:
    dtype = DTYPES[key]
    assert model_config_pb2.DataType.Name(model_config_pb2.DataType.Value(dtype.triton)) == dtype.triton
    assert BY_TRITON[dtype.triton] is dtype


@pytest.mark.parametrize("key", sorted(DTYPES))
def test_torch_holds_as_many_bytes_as_the_table_says(key: str) -> None:
    assert torch.empty((), dtype=DTYPES[key].torch_dtype()).element_size() == DTYPES[key].size


@pytest.mark.parametrize("key", MODEL_DTYPES)
def test_a_models_dtype_is_numpy_s_with_triton_s_wire_name(key: str) -> None:
    dtype = DTYPES[key]
    assert dtype.numpy_dtype().itemsize == dtype.size
    assert f"TYPE_{np_to_triton_dtype(dtype.numpy_dtype())}" == dtype.triton


def test_bf16_exists_only_between_torch_stages() -> None:
    assert "bf16" not in MODEL_DTYPES and set(INTEGER_DTYPES) == {"int64", "int32"}
    with pytest.raises(TypeError, match="numpy has no bf16"):
        DTYPES["bf16"].numpy_dtype()
    assert np.dtype(DTYPES["fp16"].numpy) == np.float16


def test_the_table_imports_without_numpy_or_torch() -> None:
    code = "import sys, python_backend.dtypes; print(sorted({'numpy', 'torch'} & set(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "[]", done.stderr

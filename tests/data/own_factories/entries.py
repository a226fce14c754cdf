"""Spec entries of the sequence factories in ``factories.py`` (``source: {python: ...}``, the folder on
the path), shared by the tests that build, serve and measure them: the Conv1d+GRU (its answer changes
when a sequence is padded) and the masked mean over frames (padding with the mask at 0 changes nothing)."""

from __future__ import annotations

from pathlib import Path

FOLDER = str(Path(__file__).resolve().parent)
FRAMES = {"name": "frames", "dtype": "fp32", "shape": [-1, 16], "max_shape": [200, 16]}
MASK = {"name": "mask", "dtype": "int64", "shape": [-1], "max_shape": [200], "range": [0, 2]}


def gru_entry(name: str = "sequence", max_batch_size: int = 8) -> dict:
    return {
        "name": name, "source": {"python": "factories:sequence_gru", "path": FOLDER},
        "sample": "factories:sequence_sample", "max_batch_size": max_batch_size, "inputs": [FRAMES],
        "outputs": [{"name": "state", "dtype": "fp32", "shape": [32]}],
    }  # fmt: skip


def masked_entry(name: str = "sequence", max_batch_size: int = 8) -> dict:
    return {
        "name": name, "source": {"python": "factories:masked_pool", "path": FOLDER},
        "sample": "factories:masked_sample", "max_batch_size": max_batch_size, "inputs": [FRAMES, MASK],
        "outputs": [{"name": "pooled", "dtype": "fp32", "shape": [32]}],
    }  # fmt: skip

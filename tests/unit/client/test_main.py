"""``python -m client`` errors that name the fix, without a server: ``infer`` reads the spec ``make serve``
recorded (and says "pass --spec" where the model is not in it), and a reader that closes stdout
(``client health | head``) ends the command quietly instead of reading as an unreachable server."""

from __future__ import annotations

import io
import json
import os
import sys
from pathlib import Path

import pytest
import yaml

import client.__main__ as client_cli

TRIVIAL = {"name": "only_this", "source": "trivial", "max_batch_size": 4,
           "inputs": [{"name": "x", "dtype": "fp32", "shape": [16]}],
           "outputs": [{"name": "y", "dtype": "fp32", "shape": [16]}]}  # fmt: skip


def test_infer_without_spec_reads_the_spec_make_serve_recorded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    monkeypatch.chdir(tmp_path)
    own = tmp_path / "own.yaml"
    own.write_text(yaml.safe_dump({"models": [TRIVIAL]}))
    (tmp_path / ".run").mkdir()
    state = {"http": "127.0.0.1:1", "grpc": "127.0.0.1:2", "spec": str(own)}
    (tmp_path / ".run" / "server.json").write_text(json.dumps(state))
    assert client_cli.main(["infer", "--model", "conv_gru"]) == 2
    error = capsys.readouterr().err
    assert f"{own} has no model, pipeline or text embedding named 'conv_gru' (it has only_this)" in error
    (tmp_path / ".run" / "server.json").write_text(json.dumps({**state, "spec": None}))  # none recorded
    assert client_cli.main(["infer", "--model", "conv_gru"]) == 2
    assert "models.yaml" in capsys.readouterr().err


def test_a_name_the_spec_lacks_is_answered_with_every_name_infer_takes_text_embeddings_included(
    capsys: pytest.CaptureFixture,
) -> None:
    """``infer`` serves a spec's text embeddings as well as its models and pipelines, so the names it
    offers for a typo are all three kinds."""
    spec = Path(__file__).resolve().parents[3] / "models.yaml"
    assert client_cli.main(["infer", "--model", "text_embeding", "--spec", str(spec)]) == 2
    offered = capsys.readouterr().err.split("(it has ", 1)[1].split(")", 1)[0].split(", ")
    assert {"recommender", "recommender_pipeline", "text_embedding", "text_embedding_int8"} <= set(offered)


def test_a_reader_that_closes_stdout_is_not_an_unreachable_server(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    monkeypatch.setattr(client_cli, "health_report", lambda *args, **kwargs: ("model READY\n" * 20_000, True))
    read_end, write_end = os.pipe()
    os.close(read_end)  # `| head` has read what it wanted and gone
    stdout = io.TextIOWrapper(os.fdopen(write_end, "wb"))
    monkeypatch.setattr(sys, "stdout", stdout)
    try:
        assert client_cli.main(["--url", "127.0.0.1:1", "health", "m"]) == 141
    finally:
        monkeypatch.undo()
        stdout.close()
    assert "cannot reach the server" not in capsys.readouterr().err


def test_a_broken_connection_still_reads_as_one(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    def broken(*args: object, **kwargs: object) -> tuple[str, bool]:
        raise BrokenPipeError(32, "Broken pipe")  # the socket to the server, stdout being fine

    monkeypatch.setattr(client_cli, "health_report", broken)
    assert client_cli.main(["--url", "127.0.0.1:1", "health", "m"]) == 2
    assert "cannot reach the server" in capsys.readouterr().err

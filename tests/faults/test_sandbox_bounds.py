"""Fault matrix row 47: the sandbox outside archives are opened in holds what runs inside it.

``sandbox_probe.py`` runs in the real sandbox (``exporters.sandbox.jail``) as hostile code would: it
cannot create a file anywhere the host sees (its input, the project, the venv, the host's ``/tmp``,
a folder it cannot see), cannot make a read-only bind writable again or open a user namespace of its
own, cannot read the host's ``/etc``, and cannot connect to a port listening on the host's loopback
or to any other address. A run that goes past its memory, CPU-time, wall-clock or output bound is
stopped with an error naming the bound and the variable that raises it, through ``exporters build``
on a crafted archive whose pickle does the damage. A sandbox that cannot start (no bwrap, an old one,
user namespaces off) is an error naming the fix, and nothing is opened outside it.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import stat
import sys
import tempfile
import threading
import uuid
from pathlib import Path

import pytest
import yaml
from crafted_programs import RunsCode, linear_program

from exporters.__main__ import main as exporters_main
from exporters.sandbox import jail
from exporters.sandbox.jail import MIB, Bounds, SandboxRunError, SandboxUnavailableError, run_in_sandbox

PROBE = Path(__file__).with_name("sandbox_probe.py")
ROOT = Path(__file__).resolve().parents[2]
SMALL = Bounds(memory_bytes=512 * MIB, cpu_s=20, wall_s=60.0, output_bytes=4 * MIB, scratch_bytes=16 * MIB)


def _probe(*arguments: str, bounds: Bounds = SMALL, inputs: dict[str, Path] | None = None) -> jail.Jailed:
    return run_in_sandbox(
        ["/in/probe.py", *arguments], {"probe.py": PROBE, **(inputs or {})}, bounds, "the probe"
    )


def test_nothing_it_writes_reaches_the_host(tmp_path: Path) -> None:
    token = uuid.uuid4().hex
    data = tmp_path / "input.bin"
    data.write_bytes(b"original")
    venv = Path(os.path.realpath(sys.prefix))
    targets = {
        "input": "/in/input.bin",
        "project": str(ROOT / "exporters" / f"sandbox-{token}"),
        "venv": str(venv / f"sandbox-{token}"),
        "unseen folder": str(tmp_path / f"sandbox-{token}"),
        "root": f"/sandbox-{token}",
        "its /tmp": f"/tmp/sandbox-{token}",
    }
    jailed = _probe("writes", *targets.values(), inputs={"input.bin": data})
    assert jailed.returncode == 0, jailed.output_tail
    found = json.loads(jailed.result)
    refused = {k: v for k, v in found.items() if v != "ok"}
    assert found[f"create {targets['its /tmp']}"] == "ok", found  # its scratch works...
    assert not Path(tempfile.gettempdir(), f"sandbox-{token}").exists()  # ...and is not the host's
    assert set(found) - set(refused) == {f"create {targets['its /tmp']}"}, found
    assert data.read_bytes() == b"original"
    for where in ("project", "venv", "unseen folder", "root"):
        assert not Path(targets[where]).exists(), f"the sandbox wrote into the {where}"
    assert refused["read /etc/passwd"].startswith("FileNotFoundError"), refused
    assert "PermissionError" in refused["remount /"] and "user namespace" in refused  # (ENOSPC: none allowed)


def test_it_reaches_no_network(tmp_path: Path) -> None:
    """A port listening on the host's loopback and an outside address: neither is reachable."""
    listener = socket.create_server(("127.0.0.1", 0))
    accepted = []
    listener.settimeout(30)

    def accept() -> None:
        with contextlib.suppress(OSError):
            accepted.append(listener.accept())

    waiter = threading.Thread(target=accept, daemon=True)
    waiter.start()
    host_port = f"127.0.0.1:{listener.getsockname()[1]}"
    try:
        jailed = _probe("network", host_port, "1.1.1.1:53", "10.0.0.1:80")
    finally:
        listener.close()
        waiter.join(timeout=5)
    assert jailed.returncode == 0, jailed.output_tail
    found = json.loads(jailed.result)
    assert all(v != "ok" for v in found.values()), found
    assert accepted == [], "the sandbox connected to the host's loopback"


def _entry(tmp_path: Path) -> Path:
    spec = tmp_path / "models.yaml"
    spec.write_text(
        yaml.safe_dump(
            {"models": [{"name": "crafted", "source": {"torch_export": "crafted.pt2"}, "max_batch_size": 8}]}
        )
    )
    return spec


def _with_pickle(tmp_path: Path, payload: RunsCode) -> None:
    """``crafted.pt2``: a valid program plus a legacy weights entry whose pickle calls ``payload``."""
    import io
    import zipfile

    import torch

    base = linear_program(tmp_path / "valid.pt2")
    buffer = io.BytesIO()
    torch.save(payload, buffer)
    with zipfile.ZipFile(base) as old, zipfile.ZipFile(tmp_path / "crafted.pt2", "w") as new:
        prefix = old.namelist()[0].split("/")[0]
        for item in old.infolist():
            new.writestr(item, old.read(item.filename))
        new.writestr(f"{prefix}/data/weights/model.pt", buffer.getvalue())


class RunsPython(RunsCode):
    """Unpickling this runs Python (``exec``) inside whatever loads it."""

    def __reduce__(self) -> tuple:
        return (exec, (self.command,))


@pytest.mark.parametrize(
    ("code", "variable", "value", "message"),
    [
        ("hog = bytearray(8 << 30)", "SANDBOX_MEMORY_MIB", "2048", "ran out of its memory bound of 2048 MiB"),
        ("while True: pass", "SANDBOX_CPU_S", "8", "killed at its CPU-time bound of 8 s (SANDBOX_CPU_S)"),
        ("import time; time.sleep(600)", "SANDBOX_WALL_S", "20", "stopped after 20 s, its wall-clock bound"),
    ],
)
def test_an_archive_that_overstays_a_bound_is_stopped_with_a_clear_error(
    code: str, variable: str, value: str, message: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture,
) -> None:  # fmt: skip
    monkeypatch.setenv("COLUMNS", "1000")
    monkeypatch.setenv("TRITON_BATCHING_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv(variable, value)
    _with_pickle(tmp_path, RunsPython(code))
    spec = _entry(tmp_path)
    status = exporters_main(
        ["build", "--spec", str(spec), "--repository", str(tmp_path / "repo"), "--gpus", "0"]
    )
    out = capsys.readouterr().out
    assert status == 1 and "crafted.source.torch_export: opening crafted.pt2 in the sandbox" in out, out
    assert message in out and variable in out, out


def test_results_beyond_the_output_bound_are_not_read() -> None:
    with pytest.raises(SandboxRunError, match="stopped: it sent more than 4 MiB of results"):
        _probe("flood")


def test_the_memory_bound_holds_without_the_exporter(tmp_path: Path) -> None:
    """The bound is the kernel's (RLIMIT_AS), whatever the code inside catches."""
    jailed = _probe("memory", str(2 << 30))
    assert jailed.returncode != 0 and "MemoryError" in jailed.output_tail
    assert "ran out of its memory bound of 512 MiB" in jail.failure(jailed, SMALL)


def _fake_bwrap(tmp_path: Path, version: str, failure: str) -> Path:
    script = tmp_path / "bwrap"
    script.write_text(
        "#!/bin/sh\n"
        f'if [ "$1" = --version ]; then echo "bubblewrap {version}"; exit 0; fi\n'
        f'echo "bwrap: {failure}" >&2; exit 1\n'
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        ("missing", "is not an executable: run `make setup`"),
        ("old", "is bubblewrap 0.6.1; the sandbox needs 0.8.0 or newer"),
        ("no userns", "No permissions to create new namespace"),
    ],
)
def test_a_sandbox_that_cannot_start_is_an_error_naming_the_fix_and_nothing_is_opened(
    setup: str, message: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    monkeypatch.setenv("COLUMNS", "1000")
    monkeypatch.setenv("TRITON_BATCHING_CACHE", str(tmp_path / "cache"))
    if setup == "missing":
        monkeypatch.setenv("BWRAP", str(tmp_path / "no-such-bwrap"))
    else:
        failure = "No permissions to create new namespace, likely because the kernel does not allow it"
        monkeypatch.setenv(
            "BWRAP", str(_fake_bwrap(tmp_path, "0.6.1" if setup == "old" else "0.8.0", failure))
        )
    marker = tmp_path / "pwned"
    _with_pickle(tmp_path, RunsCode(f"touch {marker}"))
    spec = _entry(tmp_path)
    with pytest.raises(SandboxUnavailableError, match=r"bubblewrap|bwrap|sandbox"):
        _probe("sleep", "0")
    for command in (["build", "--spec", str(spec), "--repository", str(tmp_path / "repo"), "--gpus", "0"],
                    ["init", "--torch-export", str(tmp_path / "crafted.pt2")]):  # fmt: skip
        assert exporters_main(command) == 1
        out = capsys.readouterr().out
        assert message in out, out
        if setup == "no userns":
            assert "unprivileged user namespaces are off" in out, out
    assert not marker.exists(), "the archive was opened outside the sandbox"
    assert not (tmp_path / "repo" / "crafted").exists()


def test_no_process_outlives_a_stopped_run() -> None:
    """The wall-clock bound kills bubblewrap's session; every process of the sandbox dies with it."""
    token = uuid.uuid4().hex
    bounds = Bounds(memory_bytes=512 * MIB, cpu_s=20, wall_s=3.0, output_bytes=MIB, scratch_bytes=MIB)
    with pytest.raises(SandboxRunError, match="stopped after 3 s"):
        _probe("sleep", "120", token, bounds=bounds)
    survivors = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if token.encode() in (entry / "cmdline").read_bytes():
                    survivors.append(entry.name)
            except OSError:
                continue
    assert survivors == [], survivors

"""Run a Python module of the project in a bubblewrap sandbox, bounded, and collect what it sends back
through its one pipe. What it may reach, its namespaces and its bounds: docs/SERVING.md, "Trust
boundary". bubblewrap (0.8 or newer) comes from ``$BWRAP``, else ``.venv/bubblewrap`` (``make setup``),
else ``PATH``; a sandbox that cannot start is a ``SandboxUnavailableError``, never a run unconfined."""

from __future__ import annotations

import contextlib
import functools
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import exporters
import python_backend
from exporters.errors import ExporterError

BWRAP_ENV = "BWRAP"
MIN_VERSION = (0, 8, 0)  # --disable-userns (0.8.0); --size, --perms
SANDBOX_UID = 65534  # nobody
RESULT_FD_ENV = "SANDBOX_RESULT_FD"  # the result pipe's descriptor number inside the sandbox
# How a run that hit its address-space bound ends: Python's, C++'s and the C library's words for it.
MEMORY_MARKS = (
    "MemoryError",
    "std::bad_alloc",
    "Cannot allocate memory",
    "DefaultCPUAllocator: can't allocate",
)
INPUTS = Path("/in")
PACKAGES = (exporters, python_backend)  # the project's packages, bound read-only
TAIL_BYTES = 16_384  # of the sandbox's stdout and stderr, kept for the error message
MIB = 1 << 20
# Host paths Python may need besides the interpreter and the venv, and the loader's cache.
SYSTEM_DIRS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
SYSTEM_FILES = ("/etc/ld.so.cache", "/etc/ld.so.conf")
INSTALL_HINT = (
    "run `make setup` (it unpacks Debian's bubblewrap into .venv/bubblewrap), or install bubblewrap 0.8 "
    "or newer (`apt-get install bubblewrap` on Debian 12), or set BWRAP to its path"
)
USERNS_HINT = (
    "unprivileged user namespaces are off or blocked here: enable them (Debian: `sysctl -w "
    "kernel.unprivileged_userns_clone=1`; everywhere: `user.max_user_namespaces` above 0; Ubuntu 24.04: "
    "`sysctl -w kernel.apparmor_restrict_unprivileged_userns=0` or an AppArmor profile for bwrap); in a "
    "container, allow unshare/clone in its seccomp profile"
)


class SandboxUnavailableError(ExporterError):
    """The sandbox cannot start on this machine; nothing was opened."""


class SandboxRunError(ExporterError):
    """The sandboxed process failed, or went past one of its bounds, and was stopped."""


def _environment_int(name: str, default: int) -> int:
    text = os.environ.get(name, "")
    if not text:
        return default
    if not text.isdigit() or int(text) < 1:
        raise SandboxUnavailableError(f"{name}={text!r}: must be a positive whole number")
    return int(text)


@dataclass(frozen=True)
class Bounds:
    """What the sandbox may use; ``from_environment`` reads the user's overrides (SANDBOX_*)."""

    memory_bytes: int = 8192 * MIB  # address space (RLIMIT_AS): torch and a model need a few GiB
    cpu_s: int = 900
    wall_s: float = 1200.0
    # results read back: one ONNX file (protobuf's 2 GiB) + a little
    output_bytes: int = 2048 * MIB + 64 * MIB
    scratch_bytes: int = 1024 * MIB  # the /tmp tmpfs
    open_files: int = 4096

    @classmethod
    def from_environment(cls) -> Bounds:
        return cls(
            memory_bytes=_environment_int("SANDBOX_MEMORY_MIB", cls.memory_bytes // MIB) * MIB,
            cpu_s=_environment_int("SANDBOX_CPU_S", cls.cpu_s),
            wall_s=float(_environment_int("SANDBOX_WALL_S", int(cls.wall_s))),
        )

    def describe(self) -> str:
        return (
            f"{self.memory_bytes // MIB} MiB of memory (SANDBOX_MEMORY_MIB), {self.cpu_s} s of CPU "
            f"(SANDBOX_CPU_S), {self.wall_s:.0f} s wall-clock (SANDBOX_WALL_S)"
        )


@dataclass(frozen=True)
class Jailed:
    """A finished sandboxed run: its exit status, its result pipe's bytes, its output's tail."""

    returncode: int
    result: bytes
    output_tail: str


def find_bwrap() -> str:
    """The bubblewrap binary to use; ``SandboxUnavailableError`` naming the fix when there is none."""
    configured = os.environ.get(BWRAP_ENV)
    if configured:
        if not os.access(configured, os.X_OK):
            raise SandboxUnavailableError(f"{BWRAP_ENV}={configured} is not an executable: {INSTALL_HINT}")
        return configured
    bundled = Path(sys.prefix) / "bubblewrap" / "usr" / "bin" / "bwrap"
    if os.access(bundled, os.X_OK):
        return str(bundled)
    found = shutil.which("bwrap")
    if found is None:
        raise SandboxUnavailableError(f"no bubblewrap (bwrap) to open outside archives in: {INSTALL_HINT}")
    return found


@functools.cache
def _checked_start(bwrap: str, bounds: Bounds) -> None:
    """Check bubblewrap's version and start the sandbox once with ``true``, so a machine where it cannot
    start fails with the fix."""
    try:
        text = subprocess.run([bwrap, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError) as error:
        raise SandboxUnavailableError(f"{bwrap} does not run ({error}): {INSTALL_HINT}") from error
    match = re.search(r"(\d+)\.(\d+)\.(\d+)", text)
    version = tuple(int(g) for g in match.groups()) if match else (0, 0, 0)
    if version < MIN_VERSION:
        raise SandboxUnavailableError(
            f"{bwrap} is bubblewrap {'.'.join(map(str, version))}; the sandbox needs "
            f"{'.'.join(map(str, MIN_VERSION))} or newer (--disable-userns): {INSTALL_HINT}"
        )
    try:
        done = subprocess.run(
            [*jail_arguments(bwrap, {}, bounds), "--", "true"],
            capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError) as error:
        raise SandboxUnavailableError(f"{bwrap} does not start ({error}): {INSTALL_HINT}") from error
    if done.returncode != 0:
        message = " ".join(done.stderr.split())[:300]
        raise SandboxUnavailableError(f"the sandbox does not start here ({message}): {USERNS_HINT}")


def _runtime_binds() -> list[str]:
    """Read-only binds of everything a Python of this environment needs, each at its own path."""
    arguments = ["--ro-bind", "/usr", "/usr"]
    for folder in SYSTEM_DIRS:
        if os.path.islink(folder):
            arguments += ["--symlink", os.readlink(folder), folder]
        elif os.path.isdir(folder):
            arguments += ["--ro-bind", folder, folder]
    for file in SYSTEM_FILES:
        arguments += ["--ro-bind-try", file, file]
    packages = [Path(m.__file__).resolve().parent for m in PACKAGES]
    roots = sorted(
        {os.path.realpath(sys.base_prefix), os.path.realpath(sys.prefix)} | {str(p) for p in packages}
    )
    for root in roots:
        arguments += ["--ro-bind", root, root]
    return arguments


def jail_arguments(
    bwrap: str, inputs: dict[str, Path], bounds: Bounds, result_fd: int | None = None
) -> list[str]:
    """bubblewrap's arguments up to (not including) the command: namespaces, binds, environment."""
    python_path = os.pathsep.join(sorted({str(Path(m.__file__).resolve().parents[1]) for m in PACKAGES}))
    arguments = [
        bwrap, "--unshare-all", "--unshare-user", "--disable-userns", "--uid", str(SANDBOX_UID),
        "--gid", str(SANDBOX_UID), "--cap-drop", "ALL", "--new-session", "--die-with-parent",
        "--clearenv", "--setenv", "PATH", "/usr/bin:/bin", "--setenv", "HOME", "/tmp",
        "--setenv", "LANG", "C.UTF-8", "--setenv", "PYTHONPATH", python_path,
        "--setenv", "PYTHONDONTWRITEBYTECODE", "1",
        *(["--setenv", RESULT_FD_ENV, str(result_fd)] if result_fd is not None else []),
        # /tmp first: a bind below it (a project or venv under /tmp) is then mounted on the tmpfs, not hidden
        "--perms", "1777", "--size", str(bounds.scratch_bytes), "--tmpfs", "/tmp",
        "--proc", "/proc", "--dev", "/dev",
        *_runtime_binds(),
    ]  # fmt: skip
    for inside, host in inputs.items():
        arguments += ["--ro-bind", str(host), str(INPUTS / inside)]
    # The sandbox's own root (a tmpfs bubblewrap makes, unbounded) read-only once everything is in place.
    return [*arguments, "--remount-ro", "/", "--chdir", "/tmp"]


def bounded_command(python_arguments: list[str], bounds: Bounds) -> list[str]:
    """``python python_arguments`` inside the sandbox, behind ``bounded``'s rlimits."""
    python = str(Path(os.path.realpath(sys.prefix)) / "bin" / Path(sys.executable).name)  # the venv's own
    limits = [bounds.memory_bytes, bounds.cpu_s, bounds.output_bytes, bounds.open_files]
    return [
        python, "-s", "-B", "-m", "exporters.sandbox.bounded", *map(str, limits), "--",
        python, "-s", "-B", *python_arguments,
    ]  # fmt: skip


def _collect(stream, sink: bytearray, limit: int, overflow: Callable[[], None]) -> None:
    """Read ``stream`` into ``sink``; past ``limit`` bytes, call ``overflow`` and stop; with no ``limit``,
    keep only the last ``TAIL_BYTES``."""
    with stream:
        while chunk := stream.read(65536):
            if limit and len(sink) + len(chunk) > limit:
                overflow()
                return
            sink.extend(chunk)
            if not limit:
                del sink[:-TAIL_BYTES]


def _kill_session(process: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)


def run_in_sandbox(python_arguments: list[str], inputs: dict[str, Path], bounds: Bounds, what: str) -> Jailed:
    """Run ``python python_arguments`` in the sandbox with ``inputs`` (name in ``/in`` → host file) bound
    read-only; what it wrote to ``$SANDBOX_RESULT_FD``. ``SandboxRunError`` naming ``what`` past the
    wall-clock or output bound; its exit status is the caller's to judge (``failure``)."""
    bwrap = find_bwrap()
    _checked_start(bwrap, bounds)
    read_end, write_end = os.pipe()
    command = [
        *jail_arguments(bwrap, inputs, bounds, write_end),
        "--",
        *bounded_command(python_arguments, bounds),
    ]
    try:
        process = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            pass_fds=(write_end,), start_new_session=True,
        )  # fmt: skip
    except OSError as error:
        os.close(read_end)
        raise SandboxUnavailableError(f"{bwrap} does not start ({error}): {INSTALL_HINT}") from error
    finally:
        os.close(write_end)
    result, tail, overflowed = bytearray(), bytearray(), threading.Event()

    def overflow() -> None:  # it sends too much: its session dies at once, not at the wall-clock bound
        overflowed.set()
        _kill_session(process)

    results = open(read_end, "rb")  # noqa: SIM115 (its reader thread closes it)
    sinks = ((results, result, bounds.output_bytes), (process.stdout, tail, 0))
    readers = [threading.Thread(target=_collect, args=(*sink, overflow), daemon=True) for sink in sinks]
    for reader in readers:
        reader.start()
    try:
        process.wait(timeout=bounds.wall_s)
        timed_out = False
    except subprocess.TimeoutExpired:
        _kill_session(process)
        process.wait()
        timed_out = True
    for reader in readers:
        reader.join(timeout=10)
    if overflowed.is_set():
        raise SandboxRunError(
            f"{what}: stopped: it sent more than {bounds.output_bytes // MIB} MiB of results"
        )
    if timed_out:
        raise SandboxRunError(
            f"{what}: stopped after {bounds.wall_s:.0f} s, its wall-clock bound (SANDBOX_WALL_S)"
        )
    return Jailed(process.returncode, bytes(result), tail.decode("utf-8", errors="replace"))


def failure(jailed: Jailed, bounds: Bounds) -> str:
    """Why a run failed, in one line: a bound it reached (bubblewrap reports signal N as 128 + N), else
    its exit status and the last line it printed."""
    lines = [line.strip() for line in jailed.output_tail.splitlines() if line.strip()]
    last = lines[-1][:400] if lines else "(it printed nothing)"
    if jailed.returncode == 128 + signal.SIGXCPU:
        return f"killed at its CPU-time bound of {bounds.cpu_s} s (SANDBOX_CPU_S)"
    if jailed.returncode == 128 + signal.SIGKILL:
        return f"killed (SIGKILL: its CPU-time bound of {bounds.cpu_s} s, SANDBOX_CPU_S, or the OOM killer)"
    if any(mark in jailed.output_tail for mark in MEMORY_MARKS):
        return (
            f"it ran out of its memory bound of {bounds.memory_bytes // MIB} MiB (SANDBOX_MEMORY_MIB): {last}"
        )
    return f"it exited with status {jailed.returncode}: {last}"

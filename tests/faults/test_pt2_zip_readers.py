"""Fault matrix row 48: a ``.pt2`` that shows two zip readers different entries is refused, unread.

Python's ``zipfile`` and torch's zip reader (miniz, in ``torch._C.PyTorchFileReader``) can each be shown
another archive by one crafted file (``crafted_archives``). Each construction, and seeded random
mutations of a valid program, of one listing a legacy pickle too, and of the two-directory
archive, is loaded through the loader every path uses (``test_pt2_allow_list`` drives ``exporters
build``, ``exporters init --torch-export`` and the stage runner with the two-directory one). Whenever
either reader would see the legacy pickled entry, or an entry the other does not list, the loader must
refuse with an error saying the archive is not laid out as ``torch.export.save`` lays it out; the
pickle (a marker-file creator) must never run; and whatever the loader accepts must load and run.
"""

from __future__ import annotations

import io
import logging
import zipfile
from pathlib import Path

import pytest
import torch
from crafted_archives import (
    CONSTRUCTIONS,
    LEGACY_WEIGHTS,
    Record,
    hostile_archive,
    mutations,
    program_records,
    write_archive,
)
from crafted_programs import code_pickle, linear_program

from python_backend.torch_stage.safe_program import UnsafeArtifactError, load_program_bytes

pytestmark = pytest.mark.integration

LAYOUT_REFUSAL = "not a torch.export archive as torch.export.save lays it out"


def _zipfile_names(data: bytes) -> set[str] | None:
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            return {name.split("/", 1)[-1] for name in archive.namelist()}
    except Exception:  # this reader refuses it: it loads nothing
        return None


def _torch_names(data: bytes) -> set[str] | None:
    try:
        return set(torch._C.PyTorchFileReader(io.BytesIO(data)).get_all_records())
    except Exception:
        return None


def _dangerous(data: bytes) -> bool:
    """Whether a reader would see the legacy pickle, or the two readers list different entries."""
    views = [names for names in (_zipfile_names(data), _torch_names(data)) if names is not None]
    return any(LEGACY_WEIGHTS in names for names in views) or (len(views) == 2 and views[0] != views[1])


@pytest.fixture(scope="module")
def valid(tmp_path_factory: pytest.TempPathFactory) -> Path:
    logging.getLogger("torch").setLevel(logging.ERROR)
    return linear_program(tmp_path_factory.mktemp("zip") / "valid.pt2")


def test_a_program_our_zip_writer_lays_out_loads(valid: Path) -> None:
    """The crafted archives are built by ``crafted_archives``' writer; a plain one is accepted (so a
    refusal below is the construction's, not the writer's)."""
    program = load_program_bytes(write_archive(program_records(valid)), "plain.pt2").module()
    x = torch.randn(5, 3)
    torch.testing.assert_close(program(x), torch.export.load(str(valid)).module()(x))


@pytest.mark.parametrize("construction", CONSTRUCTIONS)
def test_disagreeing_archives_are_refused(construction: str, valid: Path, tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    data = hostile_archive(construction, valid, marker)
    try:
        with pytest.raises(UnsafeArtifactError, match=LAYOUT_REFUSAL):
            load_program_bytes(data, f"{construction}.pt2")
    finally:  # what a loader that read another archive than it checked raises is beside the point
        assert not marker.exists(), f"{construction}: the legacy pickle ran"


def test_two_central_directories_show_the_readers_different_archives(valid: Path, tmp_path: Path) -> None:
    """The construction that passed a check made with ``zipfile``: ``zipfile`` sees a clean program,
    torch's reader the legacy pickle (what ``torch.export.load`` would unpickle)."""
    data = hostile_archive("two_central_directories", valid, tmp_path / "pwned")
    assert LEGACY_WEIGHTS not in (_zipfile_names(data) or {LEGACY_WEIGHTS})
    assert LEGACY_WEIGHTS in (_torch_names(data) or set())


@pytest.mark.parametrize("base", ["torch_saved", "with_legacy_pickle", "two_central_directories"])
def test_seeded_mutations_never_run_the_pickle(base: str, valid: Path, tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    if base == "torch_saved":
        data = valid.read_bytes()
    elif base == "with_legacy_pickle":  # listed (the allow-list refuses it); a mutation may hide it
        records = program_records(valid)
        top = records[0].name.split("/", 1)[0]
        data = write_archive([*records, Record(f"{top}/{LEGACY_WEIGHTS}", code_pickle(marker))])
    else:
        data = hostile_archive(base, valid, marker)
    outcomes = {"refused": 0, "accepted": 0}
    for number, mutated in enumerate(mutations(seed=len(base), data=data, count=400)):
        dangerous = _dangerous(mutated)
        try:
            program = load_program_bytes(mutated, f"{base}-{number}.pt2")
        except UnsafeArtifactError:
            outcomes["refused"] += 1
        else:
            assert not dangerous, f"{base} mutation {number}: accepted though the readers disagree"
            program.module()(torch.randn(2, 3))  # an accepted archive is a working program
            outcomes["accepted"] += 1
        assert not marker.exists(), f"{base} mutation {number}: the legacy pickle ran"
    logging.getLogger(__name__).info("%s mutations: %s", base, outcomes)
    assert outcomes["refused"] > 300, outcomes

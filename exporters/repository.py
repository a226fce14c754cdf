"""Build a Triton model repository from the spec: one folder per model, ``1/model.onnx`` + config. A
marker file at its root lets a rebuild remove the models it built that the spec lost (Triton would keep
serving them), never a folder it did not create."""

from __future__ import annotations

import logging
import shutil
import tempfile
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from exporters.artifacts.records import lend_export, read_record, write_record
from exporters.configs.model_config import ModelConfig, write_config
from exporters.configs.models import build_model_config
from exporters.errors import SpecError
from exporters.onnx_export import HASHED_FIELDS, Artifact, export_onnx
from exporters.schema.bounded_yaml import load_spec_document
from exporters.schema.models import ModelSpec, Spec, parse_spec

log = logging.getLogger(__name__)
MARKER = ".built-by-triton-batching"


@dataclass(frozen=True)
class BuiltModel:
    spec: ModelSpec
    config: ModelConfig
    artifact: Artifact


def build_model(
    spec: ModelSpec, repository: Path, num_gpus: int, earlier: Iterable[BuiltModel] = ()
) -> BuiltModel:
    """Export one model into ``repository/<name>/1`` and write its config next to it; a model of
    ``earlier`` equal in every hashed field lends its export (variants are exported once)."""
    config = build_model_config(spec, num_gpus)  # validates placement before the slow export
    out_dir = repository / spec.name / "1"
    twins = [
        b.artifact for b in earlier if all(getattr(b.spec, f) == getattr(spec, f) for f in HASHED_FIELDS)
    ]
    if twins:
        lend_export(twins[0].path.parent, out_dir, twins[0].content_hash)
    artifact = export_onnx(spec, out_dir)
    write_config(config, repository / spec.name)
    return BuiltModel(spec, config, artifact)


def prepare_repository(repository: Path, keep: Iterable[str]) -> None:
    """Create the repository; drop the folders the marker lists that the spec lost (never your own)."""
    repository.mkdir(parents=True, exist_ok=True)
    marker = repository / MARKER
    keep, built = set(keep), (read_record(marker) or {}).get("built")
    earlier = {name for name in built if isinstance(name, str)} if isinstance(built, list) else set()
    for name in sorted(earlier - keep):
        folder = repository / name
        if folder.is_dir():
            log.info("removing %s (built earlier, no longer in the spec)", folder)
            shutil.rmtree(folder)
    foreign = [c.name for c in repository.iterdir() if c.is_dir() and c.name not in keep | earlier]
    if foreign:
        log.info("%s also holds %s, not built here; left in place", repository, sorted(foreign))
    write_record(marker, {"generated_by": "python -m exporters build", "built": sorted(keep)})


def build_repository(
    spec: Spec, repository: Path, num_gpus: int, only: Iterable[str] | None = None,
    on_model: Callable[[ModelSpec], None] | None = None,
) -> list[BuiltModel]:  # fmt: skip
    """Build every model of ``spec`` (or of ``only``, which may name pipelines and text services too)."""
    selected = [m for m in spec.models if only is None or m.name in set(only)]
    owners = (*spec.pipelines, *spec.text_embeddings)  # entries that own several model folders
    missing = set(only or ()) - {entry.name for entry in (*spec.models, *owners)}
    if missing:
        spec.model(sorted(missing)[0])  # raises SpecError naming the unknown model
    keep = [m.name for m in spec.models] + [name for entry in owners for name in entry.repository_names]
    prepare_repository(repository, keep)
    built: list[BuiltModel] = []
    for model in selected:
        if on_model is not None:
            on_model(model)
        built.append(build_model(model, repository, num_gpus, earlier=built))
    return built


def spec_entry(spec_path: Path, name: str) -> dict[str, Any]:
    """Model ``name``'s entry of the spec at ``spec_path``, for a script to change and serve alone."""
    entry = next((m for m in load_spec_document(spec_path)["models"] if m["name"] == name), None)
    if entry is None:
        raise SpecError(str(spec_path), f"has no model {name!r}")
    return entry


@contextmanager
def scratch_repository(models: list[dict[str, Any]]) -> Iterator[tuple[Spec, Path]]:
    """``models`` (spec entries) built for the CPU into a repository removed when the block ends."""
    spec = parse_spec({"models": models})
    with tempfile.TemporaryDirectory() as folder:
        repository = Path(folder, "repository")
        build_repository(spec, repository, num_gpus=0)
        yield spec, repository

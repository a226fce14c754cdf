"""Python-backend models. The stub imports only what sits beside the ``model.py`` it serves, so each is
installed as a flat folder: its files plus the helpers they import, listed here and nowhere else."""

from __future__ import annotations

from pathlib import Path

from python_backend.atomic_files import copy_file

HERE = Path(__file__).parent
RUNTIME_HELPERS = ("runtime_paths.py", "batching.py", "dtypes.py")
ONNXRUNTIME_BACKEND = ("onnxruntime/model.py", "onnxruntime/ort_session.py", *RUNTIME_HELPERS)
TORCH_STAGE = ("torch_stage/model.py", "torch_stage/embedding_rows.py", "torch_stage/update_log.py",
               "atomic_files.py", *RUNTIME_HELPERS)  # fmt: skip
TEXT_TOKENIZER = ("text_tokenizer/model.py", "text_tokenizer/tokens.py", *RUNTIME_HELPERS)


def install(files: tuple[str, ...], destination: Path) -> None:
    """Copy ``files`` (one of the lists above) into ``destination``, each replaced whole: a starting stub
    never reads half a file."""
    for name in files:
        copy_file(HERE / name, destination / Path(name).name)

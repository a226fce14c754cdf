"""Write the artifacts a user might already have for the tagger: ``tagger.onnx`` (torch.onnx.export)
and ``tagger.pt2`` (torch.export.save), both with a dynamic batch and a dynamic sequence axis.

    python examples/own_model/make_artifacts.py examples/own_model/artifacts
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from own_model.net import FEATURES, MAX_TOKENS, build


def main(out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(7)
    model = build().eval()
    example = (torch.randint(0, 1000, (2, 5)), torch.randn(2, FEATURES))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            model, example, str(out_dir / "tagger.onnx"), input_names=["tokens", "features"],
            output_names=["scores"], opset_version=17, dynamo=False,
            dynamic_axes={"tokens": {0: "batch", 1: "length"}, "features": {0: "batch"},
                          "scores": {0: "batch"}},
        )  # fmt: skip
    batch = torch.export.Dim("batch", min=1, max=64)
    length = torch.export.Dim("length", min=1, max=MAX_TOKENS)
    program = torch.export.export(
        model, example, dynamic_shapes={"tokens": {0: batch, 1: length}, "features": {0: batch}}
    )
    torch.export.save(program, str(out_dir / "tagger.pt2"))


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).parent / "artifacts"))

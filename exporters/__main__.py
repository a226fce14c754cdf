"""``python -m exporters build``: models.yaml → model_repository, with a progress bar and a summary;
``validate`` checks the spec alone; ``init`` prints a models.yaml entry read from your artifact."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.progress import Progress
from rich.table import Table

from exporters.configs.models import QUEUE_POLICY_SPARE_INSTANCES, lacks_spare_instances
from exporters.devices import detect_gpu_count
from exporters.errors import ExportCheckError, ExporterError, SpecError
from exporters.init.entry import entry_yaml, init_entry, parse_ranges, tried_lengths
from exporters.memory import measured_instance_memory
from exporters.pipelines.build import BuiltPipeline, build_pipelines
from exporters.repository import build_repository
from exporters.resolve import load_spec
from exporters.sources.inputs import check_samplers
from exporters.text.embedding import build_text_embeddings
from python_backend.atomic_files import explain

# How each failure is shown and the exit status it gives: a spec to fix, a failed check, the rest.
FAILURES = (
    (SpecError, "spec error", 2),
    (ExportCheckError, "export check failed", 3),
    (BaseException, "error", 1),
)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m exporters", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    build = sub.add_parser("build", help="export every model of the spec and write its config.pbtxt")
    build.add_argument("--spec", type=Path, default=Path("models.yaml"))
    build.add_argument("--repository", type=Path, default=Path("model_repository"))
    build.add_argument("--models", help="comma-separated subset of model and pipeline names")
    build.add_argument("--gpus", type=int, help="plan for N GPUs (default: detect; 0 forces CPU placement)")
    build.add_argument(
        "--measure-memory", action="store_true",
        help="also measure the memory one instance of each model holds at its max batch (once per file)",
    )  # fmt: skip
    validate = sub.add_parser("validate", help="check models.yaml and exit")
    validate.add_argument("--spec", type=Path, default=Path("models.yaml"))
    init = sub.add_parser("init", help="print a models.yaml entry read from an artifact")
    what = init.add_mutually_exclusive_group(required=True)
    what.add_argument("--onnx", metavar="FILE", help="an ONNX file")
    what.add_argument("--torch-export", metavar="FILE", help="a torch.export program (.pt2)")
    what.add_argument("--huggingface", metavar="FOLDER_OR_PACKAGE", help="a transformers model, offline")
    what.add_argument("--python", metavar="MODULE:FACTORY", help="your factory returning an nn.Module")
    init.add_argument("--path", help="with --python: folder to put on sys.path")
    init.add_argument("--sample", metavar="MODULE:FUNCTION", help="with --python: sample(batch, rng) -> dict")
    init.add_argument("--options", type=json.loads, default=None, help="with --python: factory kwargs (JSON)")
    init.add_argument("--name", help="Triton model name (default: from the artifact)")
    init.add_argument("--max-batch-size", type=int, default=16)
    init.add_argument("--max-length", type=int, help="bound for variable axes the artifact leaves open")
    init.add_argument("--precision", choices=("fp32", "fp16", "int8"), default="fp32")
    init.add_argument(
        "--range", action="append", metavar="NAME=LO:HI",
        help="valid ids LO..HI-1 of an integer input the artifact does not bound (repeatable)",
    )  # fmt: skip
    return parser


def _init(args: argparse.Namespace) -> str:
    kind = next(k for k in ("onnx", "torch_export", "huggingface", "python") if getattr(args, k))
    spec = init_entry(
        kind, getattr(args, kind), name=args.name, max_batch_size=args.max_batch_size,
        max_length=args.max_length, precision=args.precision, sample=args.sample, path=args.path,
        options=args.options, ranges=parse_ranges(args.range),
    )  # fmt: skip
    note = ""
    if kind == "onnx":  # the file states its axes variable, not which lengths it runs at: try them
        spec, note = tried_lengths(spec, Path(args.onnx), f"--onnx {args.onnx}")
    return entry_yaml(spec, notes=[note] if note else [])


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    # Piped or redirected, rich would fold the tables to 80 columns and cut model names short; a
    # message stays one line however long (soft_wrap), so logs and grep see it whole.
    console = Console() if sys.stdout.isatty() else Console(width=200)
    try:
        if args.command == "init":
            print(_init(args), end="")
            return 0
        spec = load_spec(args.spec)
        if args.command == "validate":
            check_samplers(spec)  # the functions the build would call, imported and their signature read
            console.print(
                f"{args.spec}: {len(spec.models)} models, {len(spec.pipelines)} pipelines, "
                f"{len(spec.text_embeddings)} text embeddings, valid"
            )
            return 0
        gpus = detect_gpu_count() if args.gpus is None else args.gpus
        only = args.models.split(",") if args.models else None
        count = len(only) if only else len(spec.models) + len(spec.pipelines) + len(spec.text_embeddings)
        with Progress(console=console, transient=True) as progress:
            task = progress.add_task("exporting", total=count)

            def advance(model):
                progress.update(task, description=f"exporting {model.name} ({model.precision})")

            def advance_pipeline(pipeline):
                progress.update(task, description=f"splitting {pipeline.name} ({pipeline.split})")

            built = build_repository(spec, args.repository, gpus, only, on_model=advance)
            pipelines = build_pipelines(spec, args.repository, gpus, only, on_pipeline=advance_pipeline)
            progress.update(task, description="exporting text embeddings")
            texts = build_text_embeddings(spec.text_embeddings, args.repository, gpus, only)
            progress.update(task, completed=count)
            memory = {}
            if args.measure_memory:
                progress.update(task, description="measuring memory per instance")
                memory = {b.spec.name: measured_instance_memory(b.spec, b.artifact.path) for b in built}
    except (ExporterError, OSError) as error:  # OSError: a full disk above all, named with the space it needs
        label, status = next((label, status) for kind, label, status in FAILURES if isinstance(error, kind))
        message = str(error) if isinstance(error, ExporterError) else explain(error)
        console.print(f"[red]{label}[/red] {escape(message)}", soft_wrap=True)
        return status
    table = Table(title=f"{args.repository} (planned GPUs: {gpus})")
    columns = ["model", "precision", "batching", "instances", "max rel err (limit)", "export"]
    for column in columns + (["MiB per instance (CPU)"] if memory else []):
        table.add_column(column, no_wrap=column == "model")
    for item in built:
        groups = ", ".join(f"{g.kind}×{g.count}{g.gpus or ''}" for g in item.config.instance_group)
        table.add_row(
            item.spec.name, item.spec.precision, item.spec.batching.mode, groups,
            f"{item.artifact.max_rel_error:.2e} ({item.artifact.tolerance:g})",
            "cached" if item.artifact.cached else "exported",
            *([f"{memory[item.spec.name] / 2**20:.1f}"] if memory else []),
        )  # fmt: skip
    console.print(table)
    if pipelines:
        console.print(_pipeline_table(pipelines))
    configs = [item.config for item in built] + [c for p in pipelines for c in p.configs]
    names = [c.name for c in configs if lacks_spare_instances(c)]
    if names:
        console.print(
            f"[yellow]warning[/yellow] a queue policy with fewer than {QUEUE_POLICY_SPARE_INSTANCES} "
            f"instances per device: {', '.join(names)}. On Triton 2.51 their requests can wait ~500 ms "
            f"now and then (docs/SERVING.md, row 11); give them "
            f"{QUEUE_POLICY_SPARE_INSTANCES} instances or drop the policy."
        )
    for text, record in texts:
        limits = ", ".join(f"{k} {v:g}" for k, v in record["outputs"][0]["tolerance"].items() if k != "kind")
        console.print(
            f"text embedding {text.name} ({text.precision}, buckets {list(text.buckets)}): "
            f"max abs error {record['max_abs_error']:.1e}, min cosine {record['min_cosine']:.6f} vs torch "
            f"(limits: {limits}){' (cached)' if record['cached'] else ''}"
        )
    return 0


def _pipeline_table(pipelines: list[BuiltPipeline]) -> Table:
    table = Table(title="pipelines (ensembles of stages; details in <pipeline>/pipeline.json)")
    for column in ("pipeline", "stages (placement)", "cuts", "boundary", "compression err", "export"):
        table.add_column(column)
    for item in pipelines:
        stages = ", ".join(
            f"{c.name.removeprefix(item.spec.name + '_')} {g.kind}×{g.count}{g.gpus or ''}"
            for c in item.configs[1:]
            for g in c.instance_group
        )
        record = item.record
        plan = record.split_plan
        cuts = f"{list(plan.cuts)} by {plan.cost_method}" if plan else "embedding | dense"
        if plan and len(plan.near_cuts) > 1:  # the timing could not tell these apart
            cuts += f" ({len(plan.near_cuts)} within {plan.noise:.0%} noise; {plan.tie_method} chose)"
        boundary = f"{record.boundary_dtype}, {record.boundary_bytes_per_request} B/req"
        table.add_row(
            item.spec.name, stages, cuts, boundary, f"{record.compression_max_rel_error:.1e}",
            "cached" if item.cached else "exported",
        )  # fmt: skip
    return table


if __name__ == "__main__":
    sys.exit(main())

"""``python -m client {health,metadata,infer,stats}``: talk to the served repository; ``infer --check``
exits 1 when the answer differs from the model it was exported from, so it can gate a deployment."""

from __future__ import annotations

import argparse
import json
import os
import select
import sys
from functools import partial
from pathlib import Path

import numpy as np
from tritonclient.utils import InferenceServerException

from client.connection import connect, model_config, recorded_path, recorded_warmup
from client.errors import ClientError, MismatchError
from client.health import report as health_report
from client.infer import infer
from client.stats import fetch_stats, parse_version_stats, without_warmup
from server.records import warmup_counts

DEFAULT_SPEC = Path("models.yaml")


def _health(client, args) -> int:
    paths = (args.admin_key_file, args.events, args.supervisor)
    repository = args.repository or recorded_path("repository")
    text, ok = health_report(client, args.protocol, args.models, *paths, repository=repository)
    print(text)
    return 0 if ok else 1


def _metadata(client, args) -> int:
    as_json = {"as_json": True} if args.protocol == "grpc" else {}  # else gRPC answers a protobuf message
    get = partial(client.get_model_metadata, args.model) if args.model else client.get_server_metadata
    print(json.dumps(get(**as_json), indent=2))
    return 0


def _infer(client, args) -> int:
    from client.text_reference import infer_text, text_entry  # torch: only for the command that needs it

    spec = args.spec or recorded_path("spec") or DEFAULT_SPEC
    entry = text_entry(spec, args.model, bool(args.text))
    if entry is not None:
        return infer_text(client, args.protocol, args.model, entry, args.text, args.check)
    from client.reference import reference  # torch and the zoo, only for the command that needs them

    expected = reference(spec, args.model, args.batch, args.seed)
    outputs = infer(client, args.protocol, args.model, expected.inputs, use_shm=args.shm == "system")
    via = f"{args.protocol}{' + system shm' if args.shm == 'system' else ''}"
    for name, array in outputs.items():
        preview = np.array2string(array.ravel()[:6], precision=4)
        print(f"{args.model} via {via}: {name} shape={list(array.shape)} dtype={array.dtype} first={preview}")
    if not args.check:
        return 0
    try:
        report = expected.compare(outputs, f"{args.model} served over {via}")
    except MismatchError as error:
        print(f"MISMATCH: {error}", file=sys.stderr)
        return 1
    print(
        f"match: max abs error {report.max_abs_error:.3g}, max rel error {report.max_rel_error:.3g} "
        f"({expected.precision}; " + "; ".join(check.summary() for check in report.checks) + ")"
    )
    return 0


def _stats(client, args) -> int:
    """Each model's statistics without the warm-up Triton ran at load, where ``make serve`` recorded it."""
    warmups = recorded_warmup(args.url)
    for entry in fetch_stats(client, args.protocol, args.model).get("model_stats", []):
        name, version = entry["name"], entry.get("version", "")
        stats, warmup = without_warmup(parse_version_stats(entry), (warmups or {}).get(name, {}).get(version))
        if warmup is None:
            executions, inferences = warmup_counts(model_config(client, args.protocol, name))
            included = f"; includes the warm-up Triton ran at load ({inferences} inferences), not recorded"
            warm = included if executions and stats.executions else ""
        else:
            warm = f"; without the warm-up Triton ran at load ({warmup.inferences} inferences, subtracted)"
        if not stats.inferences and not args.model:
            continue
        print(
            f"{name} v{version}: {stats.inferences} inferences in {stats.executions} executions "
            f"(mean batch {stats.mean_batch:.2f}); server-counted success {stats.requests} / fail "
            f"{stats.failed} (2.51 counts Python-backend errors as success); queue "
            f"{stats.queue_ms_per_request:.3f} ms/req, compute {stats.compute_ms_per_request:.3f} ms/req"
            + warm
        )
        for size, bucket in sorted(stats.batches.items()):
            each = stats.compute_ms_at(size)
            print(f"    batch {size:4d}: {bucket.executions:7d} executions, {each:.3f} ms each")
    return 0


def stdout_gone() -> bool:
    """Whether stdout's reader has closed it (``client health | head``): the pipe then polls as an error."""
    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & (select.POLLERR | select.POLLHUP) for _, events in poller.poll(0))
    except (OSError, ValueError, AttributeError):  # not a file descriptor (captured): not a pipe
        return False


def reader_gone() -> int:
    """End quietly with 141 (128 + SIGPIPE), as a Unix tool does; what is buffered goes to /dev/null,
    else Python's flush at exit would report the pipe again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return 141


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m client", description=__doc__)
    parser.add_argument("--protocol", choices=("http", "grpc"), default="http")
    parser.add_argument("--url", help="host:port (default: from `make serve`, else 127.0.0.1:8000/8001)")
    sub = parser.add_subparsers(dest="command", required=True)
    health = sub.add_parser("health", help="server live/ready, and whether each model serves")
    health.add_argument("models", nargs="*", help="default: every model (needs the admin key)")
    health.add_argument("--admin-key-file", type=Path, default=Path(".run/admin.key"))
    health.add_argument("--events", type=Path, default=Path(".run/watchdog.json"), help="watchdog record")
    health.add_argument(
        "--supervisor", type=Path, default=Path(".run/supervisor.json"), help="supervisor record"
    )
    health.add_argument(
        "--repository", type=Path, help="compare served configs with its config.pbtxt (default: make serve's)"
    )
    metadata = sub.add_parser("metadata", help="server metadata, or a model's with --model")
    metadata.add_argument("--model")
    run = sub.add_parser("infer", help="send inputs drawn from the zoo; --check compares with torch")
    run.add_argument("--model", required=True)
    run.add_argument("--batch", type=int, default=4)
    run.add_argument("--seed", type=int, default=0)
    run.add_argument("--spec", type=Path, help=f"the model's spec (default: make serve's, or {DEFAULT_SPEC})")
    run.add_argument(
        "--shm", choices=("none", "system"), default="none", help="pass tensors by system shared memory"
    )
    run.add_argument("--check", action="store_true", help="exit 1 unless the answer matches the torch model")
    run.add_argument(
        "--text",
        action="append",
        help="a text to embed (text-embedding models; repeatable; default: a corpus)",
    )
    stats = sub.add_parser("stats", help="server statistics: formed batches, queue and compute time")
    stats.add_argument("--model", default="")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    handlers = {"health": _health, "metadata": _metadata, "infer": _infer, "stats": _stats}
    try:
        client = connect(args.protocol, args.url)
        status = handlers[args.command](client, args)
        sys.stdout.flush()  # a reader that went away (`| head`) shows here, inside the handling below
        return status
    except InferenceServerException as error:
        print(f"server error: {error}", file=sys.stderr)
        return 2
    except ClientError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except ConnectionError as error:  # BrokenPipeError too: which end broke decides what it means
        if isinstance(error, BrokenPipeError) and stdout_gone():
            return reader_gone()
        print(f"cannot reach the server: {error} (is it running? `make serve`)", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

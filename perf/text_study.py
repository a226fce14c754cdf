"""The text-embedding study: how variable-length text batches, measured on all-MiniLM-L6-v2.

One server serves the same encoder in four configurations (``MODES``): no batching; dynamic batching
on exact lengths (only equal lengths merge); dynamic batching with length buckets (the shipped
``text_embedding``); and padded-to-longest (ragged batching, each formed batch padded to its longest
member on the Python backend). Every mode gets the same deterministic corpus (``text_corpus``):

* closed loop at ``concurrency`` on the mixed corpus and on short queries alone;
* Poisson arrivals at ``load_fraction`` of the bucketed mode's capacity, the same arrivals for all;
* short queries (Poisson) alone, then with long passages sharing the server (closed loop);
* from the server: formed batch sizes at the encoder (``batch_stats``) and padding waste (computed /
  real tokens, from the tokenizer's and the ragged encoder's custom metrics);
* references in the same run: the encoder file in onnxruntime in-process, batched by bucket like the
  server, and sentence-transformers' ``encode``; the latency model ``T + (N−1)·Δt`` per bucket length.

Writes ``text_embedding.md``, ``text_embedding.json`` and ``text_records.csv`` into the report folder.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import re
import urllib.request
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from client.stats import ModelStats, parse_model_stats
from exporters.spec import Batching
from exporters.text_embedding import build_text_embedding, model_folder
from exporters.text_spec import DEFAULT_BUCKETS, DEFAULT_PACKAGE, TextEmbeddingSpec
from perf.goals import Goal
from perf.latency_model import fit_latency
from perf.loads import Load, closed_loop, poisson
from perf.markdown import number, ratio, table
from perf.measure import Measurement, MeasureSettings, measure_async
from perf.records import Record, write_csv
from perf.summary import Summary
from perf.target import Target
from perf.text_corpus import (
    CorpusCaller,
    CorpusText,
    bucket_latency,
    make_corpus,
    raw_onnxruntime,
    sentence_transformers_rate,
    text_pool,
)
from python_backend.text_tokenizer.tokens import TextTokenizer
from server import ServerOptions, TritonServer

log = logging.getLogger(__name__)
WORKDIR = Path(".run/perf")
DYNAMIC = Batching(mode="dynamic", max_queue_delay_us=2000)
EMBEDDING_BYTES = 384 * 4


@dataclass(frozen=True)
class TextMode:
    name: str
    title: str
    buckets: tuple[int, ...]
    batching: Batching
    ragged: bool = False

    def spec(self) -> TextEmbeddingSpec:
        return TextEmbeddingSpec(name=f"text_{self.name}", buckets=self.buckets, batching=self.batching)


MODES = {
    m.name: m
    for m in (
        TextMode("none", "no batching", (), Batching(mode="none")),
        TextMode("exact", "dynamic, exact lengths", (), DYNAMIC),
        TextMode("buckets", "dynamic + length buckets", DEFAULT_BUCKETS, DYNAMIC),
        TextMode("longest", "dynamic, padded to longest (ragged)", (), DYNAMIC, ragged=True),
    )
}


@dataclass(frozen=True)
class TextStudyPlan:
    modes: tuple[str, ...] = tuple(MODES)
    concurrency: int = 16
    load_fraction: float = 0.6  # Poisson rate / the bucketed mode's closed-loop capacity (mixed corpus)
    share_fraction: float = 0.3  # short-query rate / the bucketed mode's short-query capacity
    passage_concurrency: int = 2  # long passages in flight while short queries are measured
    corpus_size: int = 512
    reference_texts: int = 128  # the in-process references run the corpus's first texts
    settings: MeasureSettings = field(
        default_factory=lambda: MeasureSettings(warmup_s=0.5, window_s=1.0, stable_windows=3, max_windows=4)
    )
    raw_batches: tuple[int, ...] = (1, 4, 16)
    latency_lengths: tuple[int, ...] = DEFAULT_BUCKETS
    latency_batches: tuple[int, ...] = (1, 2, 4, 8, 16)
    references: bool = True  # sentence-transformers in-process (slow to import)


PLANS = {
    "default": TextStudyPlan(),
    "quick": TextStudyPlan(
        modes=("none", "buckets", "longest"),
        corpus_size=256,
        settings=MeasureSettings(warmup_s=0.3, window_s=0.6, stable_windows=2, max_windows=3),
        raw_batches=(1, 16),
        latency_lengths=(16, 64, 256),
        latency_batches=(1, 4, 16),
    ),
    "smoke": TextStudyPlan(
        modes=("none", "buckets", "longest"),
        concurrency=4,
        corpus_size=64,
        settings=MeasureSettings(warmup_s=0.2, window_s=0.4, stable_windows=1, max_windows=1),
        raw_batches=(1, 4),
        latency_lengths=(16, 64),
        latency_batches=(1, 4),
        references=False,
    ),
}


@dataclass
class Point:
    """One measurement: a mode under a load, with the encoder's view of it."""

    mode: str
    load: str
    summary: Summary
    sent: int
    formed: dict[int, int]  # encoder batch size -> executions
    padding_waste: float  # computed tokens / real tokens
    records: list[Record] = field(repr=False, default_factory=list)

    @property
    def mean_batch(self) -> float:
        executions = sum(self.formed.values())
        return sum(s * n for s, n in self.formed.items()) / executions if executions else math.nan


@dataclass
class TextStudyResult:
    plan: TextStudyPlan
    points: list[Point] = field(default_factory=list)
    rate: float = 0.0
    raw: dict[str, list[float]] = field(default_factory=dict)  # label -> [batch, sentences/s, waste]
    sentence_transformers: float = math.nan
    latency: dict[int, dict[int, float]] = field(default_factory=dict)

    def point(self, mode: str, load: str) -> Point | None:
        return next((p for p in self.points if p.mode == mode and p.load == load), None)


# --- the server's view -----------------------------------------------------------------------------

COUNTER = re.compile(r"^(\w+)\{([^}]*)\}\s+([0-9.eE+-]+)$")


def token_counters(metrics: str, model: str) -> dict[str, float]:
    """``{metric:kind: value}`` of this project's token counters for ``model``."""
    values: dict[str, float] = {}
    for line in metrics.splitlines():
        match = COUNTER.match(line.strip())
        if not match or match.group(1) not in ("text_tokens_total", "ragged_batch_elements_total"):
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', match.group(2)))
        if labels.get("model") == model:
            values[f"{match.group(1)}:{labels.get('kind')}"] = float(match.group(3))
    return values


@dataclass(frozen=True)
class Counts:
    encoder: ModelStats
    tokens: dict[str, float]


def _read(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=10) as response:
        return response.read()


def counts(server: TritonServer, spec: TextEmbeddingSpec) -> Counts:
    stats = parse_model_stats(
        json.loads(_read(f"http://{server.http_url}/v2/models/{spec.encoder_name}/stats"))
    )
    metrics = _read(server.metrics_url).decode()
    return Counts(
        stats, token_counters(metrics, spec.tokenizer_name) | token_counters(metrics, spec.encoder_name)
    )


def padding_waste(before: Counts, after: Counts) -> float:
    """Computed / real tokens: the tokenizer's padding, or the ragged encoder's padding per batch."""
    diff = {k: after.tokens.get(k, 0.0) - before.tokens.get(k, 0.0) for k in after.tokens}
    real = diff.get("text_tokens_total:real", 0.0)
    computed = diff.get("ragged_batch_elements_total:computed") or diff.get("text_tokens_total:padded", 0.0)
    return computed / real if real else math.nan


# --- measuring -------------------------------------------------------------------------------------


def _target(server: TritonServer, model: str, corpus: list[CorpusText]) -> Target:
    return Target(model, server.grpc_url, {"text": text_pool(corpus)}, {"embedding": EMBEDDING_BYTES})


async def _run(server: TritonServer, model: str, corpus: list[CorpusText], load: Load, settings, label: str):
    target = _target(server, model, corpus)
    return await measure_async(target, load, settings, label=label, caller_class=CorpusCaller)


def measure_mode(
    server: TritonServer, mode: TextMode, corpus: list[CorpusText], load: Load, settings: MeasureSettings,
    load_name: str,
) -> Point:  # fmt: skip
    spec = mode.spec()
    before = counts(server, spec)
    measurement: Measurement = asyncio.run(
        _run(server, spec.name, corpus, load, settings, f"{mode.name} {load_name}")
    )
    after = counts(server, spec)
    formed = {s: b.executions for s, b in (after.encoder - before.encoder).batches.items() if b.executions}
    return Point(
        mode.name, load_name, measurement.summary(), measurement.attempts, formed,
        padding_waste(before, after), measurement.records,
    )  # fmt: skip


def measure_sharing(
    server: TritonServer, mode: TextMode, queries: list[CorpusText], passages: list[CorpusText], rate: float,
    plan: TextStudyPlan,
) -> tuple[Point, Point]:  # fmt: skip
    """Short queries (Poisson at ``rate``) while long passages keep the same server busy."""
    spec = mode.spec()

    async def both():
        return await asyncio.gather(
            _run(server, spec.name, queries, poisson(rate, seed=7), plan.settings, "queries shared"),
            _run(
                server, spec.name, passages, closed_loop(plan.passage_concurrency), plan.settings, "passages"
            ),
        )

    before = counts(server, spec)
    shared, busy = asyncio.run(both())
    after = counts(server, spec)
    formed = {s: b.executions for s, b in (after.encoder - before.encoder).batches.items() if b.executions}
    waste = padding_waste(before, after)
    return (
        Point(mode.name, "queries shared", shared.summary(), shared.attempts, formed, waste, shared.records),
        Point(mode.name, "passages", busy.summary(), busy.attempts, formed, waste, busy.records),
    )


def build_study_repository(plan: TextStudyPlan, repository: Path) -> None:
    """One ensemble per mode, all with the same encoder file (exported once, copied)."""
    done: dict[str, Path] = {}
    for name in plan.modes:
        mode = MODES[name]
        build_text_embedding(mode.spec(), repository, num_gpus=0, ragged=mode.ragged, done=done)


def measure_references(
    plan: TextStudyPlan, result: TextStudyResult, corpus: list[CorpusText], onnx: Path
) -> None:
    folder = model_folder(DEFAULT_PACKAGE)
    tokenizer_path = str(folder / "tokenizer.json")
    bucketed = TextTokenizer(tokenizer_path, 256, DEFAULT_BUCKETS)
    exact = TextTokenizer(tokenizer_path, 256)
    served = result.point("buckets", "closed mixed")
    batches = sorted({*plan.raw_batches, *([max(1, round(served.mean_batch))] if served else [])})
    for batch in batches:
        rate, waste = raw_onnxruntime(str(onnx), bucketed, corpus, batch)
        result.raw[f"buckets, batch {batch}"] = [batch, rate, waste]
    rate, waste = raw_onnxruntime(str(onnx), exact, corpus, 1)
    result.raw["exact lengths, batch 1"] = [1, rate, waste]
    if plan.references:
        result.sentence_transformers = sentence_transformers_rate(DEFAULT_PACKAGE, corpus)
    result.latency = bucket_latency(str(onnx), plan.latency_lengths, plan.latency_batches)


def run(plan: TextStudyPlan, folder: Path, workdir: Path = WORKDIR) -> TextStudyResult:
    """Build, serve, measure every mode, then the in-process references (server stopped)."""
    repository = workdir / "text_repository"
    build_study_repository(plan, repository)
    corpus = make_corpus(plan.corpus_size, seed=0)
    queries = [c for c in corpus if c.kind == "query"]
    passages = [c for c in corpus if c.kind == "passage"]
    result = TextStudyResult(plan)
    options = ServerOptions(repository=repository, startup_timeout_s=300, log_path=folder / "text_server.log")
    with TritonServer(options) as server:
        closed = closed_loop(plan.concurrency)
        for name in plan.modes:
            result.points.append(
                measure_mode(server, MODES[name], corpus, closed, plan.settings, "closed mixed")
            )
            result.points.append(
                measure_mode(server, MODES[name], queries, closed, plan.settings, "closed queries")
            )
        anchor = result.point("buckets", "closed mixed") or result.points[0]
        result.rate = max(plan.load_fraction * anchor.summary.throughput, 1.0)
        for name in plan.modes:
            arrivals = poisson(result.rate, seed=plan.corpus_size)
            result.points.append(
                measure_mode(server, MODES[name], corpus, arrivals, plan.settings, "Poisson mixed")
            )
        share_mode = MODES["buckets" if "buckets" in plan.modes else plan.modes[0]]
        short = result.point(share_mode.name, "closed queries")
        share_rate = max(plan.share_fraction * short.summary.throughput, 1.0)
        alone = measure_mode(
            server, share_mode, queries, poisson(share_rate, seed=7), plan.settings, "queries alone"
        )
        result.points += [alone, *measure_sharing(server, share_mode, queries, passages, share_rate, plan)]
    onnx = repository / MODES[plan.modes[0]].spec().encoder_name / "1" / "model.onnx"
    measure_references(plan, result, corpus, onnx)
    return result


# --- goals and report ------------------------------------------------------------------------------


def _served_vs_raw(result: TextStudyResult) -> Goal | None:
    served = result.point("buckets", "closed mixed")
    if not served or not served.formed:
        return None
    batch = max(1, round(served.mean_batch))
    raw = result.raw.get(f"buckets, batch {batch}")
    if raw is None:
        return None
    value = served.summary.throughput / raw[1]
    measured = (
        f"{ratio(value)} ({served.summary.throughput:.1f} vs {raw[1]:.1f} sentences/s at batch {batch})"
    )
    return Goal(
        "served text embedding ≥ 0.8× raw onnxruntime at the same batches", "≥ 0.80×", measured, value >= 0.8,
        "raw runs in-process (tokenization included); serving adds gRPC, the ensemble and two Python-backend "
        "hops, on the same 2 cores as the client",
    )  # fmt: skip


def _dynamic_vs_none(result: TextStudyResult) -> Goal | None:
    none, dyn = result.point("none", "closed queries"), result.point("buckets", "closed queries")
    if not none or not dyn:
        return None
    value = dyn.summary.throughput / none.summary.throughput
    measured = (
        f"{ratio(value)} ({dyn.summary.throughput:.1f} vs {none.summary.throughput:.1f} sentences/s, "
        f"mean formed batch {number(dyn.mean_batch)} vs {number(none.mean_batch)})"
    )
    return Goal(
        "dynamic batching (buckets) ≥ 1.5× no batching on short queries", "≥ 1.50×", measured, value >= 1.5
    )


def _sharing(result: TextStudyResult) -> Goal | None:
    alone = next((p for p in result.points if p.load == "queries alone"), None)
    shared = next((p for p in result.points if p.load == "queries shared"), None)
    if not alone or not shared:
        return None
    value = shared.summary.p99_ms / alone.summary.p99_ms
    measured = (
        f"{ratio(value)} (p99 {shared.summary.p99_ms:.1f} ms shared vs {alone.summary.p99_ms:.1f} alone)"
    )
    return Goal(
        "short-query p99 not inflated by long passages sharing the server", "≤ 1.50×", measured, value <= 1.5,
        "one encoder instance: a query waits behind a running batch of long passages (head-of-line)",
    )  # fmt: skip


def goals(result: TextStudyResult) -> list[Goal]:
    """The issue's three goals, each as a ratio within this run (absent when not measured)."""
    return [g for g in (_served_vs_raw(result), _dynamic_vs_none(result), _sharing(result)) if g is not None]


def _rows(result: TextStudyResult, load: str) -> list[list[str]]:
    base = result.point("none", load)
    rows = []
    for point in (p for p in result.points if p.load == load):
        gain = point.summary.throughput / base.summary.throughput if base else math.nan
        rows.append([
            MODES[point.mode].title, number(point.summary.throughput), number(point.summary.p50_ms),
            number(point.summary.p99_ms), number(point.mean_batch, 2), ratio(point.padding_waste),
            f"{sum(not r.ok for r in point.records)}/{point.sent}", ratio(gain),
        ])  # fmt: skip
    return rows


MODE_HEADER = [
    "mode",
    "sentences/s",
    "p50 ms",
    "p99 ms",
    "mean formed batch",
    "padding waste",
    "failed/sent",
    "×none",
]


def report(result: TextStudyResult) -> str:
    plan = result.plan
    lines = [
        "# Text embedding study (all-MiniLM-L6-v2)",
        "",
        f"Corpus: {plan.corpus_size} deterministic texts (60% queries of 3–10 words, 25% sentences of 12–30, "
        f"15% passages of 90–200); one text per request, gRPC. Padding waste = computed / real tokens.",
    ]
    for load, title in (
        ("closed mixed", f"Closed loop, concurrency {plan.concurrency}, mixed corpus"),
        ("closed queries", f"Closed loop, concurrency {plan.concurrency}, short queries only"),
        ("Poisson mixed", f"Poisson {result.rate:.1f}/s (same arrivals for every mode), mixed corpus"),
    ):
        lines += ["", f"## {title}", "", table(MODE_HEADER, _rows(result, load))]
    sharing = [p for p in result.points if p.load in ("queries alone", "queries shared", "passages")]
    lines += ["", "## Short queries with long passages sharing the server", "", table(
        ["stream", "sentences/s", "p50 ms", "p99 ms", "mean formed batch"],
        [[p.load, number(p.summary.throughput), number(p.summary.p50_ms), number(p.summary.p99_ms),
          number(p.mean_batch, 2)] for p in sharing],
    )]  # fmt: skip
    refs = [
        [f"raw onnxruntime in-process ({label})", number(v[1]), ratio(v[2])]
        for label, v in result.raw.items()
    ]
    refs.append(
        ["sentence-transformers encode(batch_size=32) in-process", number(result.sentence_transformers), "–"]
    )
    lines += ["", "## References (same run, server stopped, tokenization included)", "",
              table(["reference", "sentences/s", "padding waste"], refs)]  # fmt: skip
    fits = []
    for length, points in sorted(result.latency.items()):
        fit = fit_latency(points)
        top = max(points)
        fits.append([length, number(fit.t_ms, 2), number(fit.dt_ms, 2), f"{fit.r2:.3f}",
                     ratio(fit.throughput(top) / fit.throughput(1)), f"batch {top}"])  # fmt: skip
    lines += ["", "## Latency model per padded length: T_batch(N) = T + (N−1)·Δt (raw onnxruntime)", "",
              table(["length", "T ms", "Δt ms", "R²", "predicted gain", "at"], fits)]  # fmt: skip
    lines += ["", "## Goals", "", table(
        ["goal", "target", "measured", "verdict", "what limits it"],
        [[g.name, g.target, g.measured, {True: "met", False: "MISSED", None: "n/a"}[g.met], g.limits]
         for g in goals(result)],
    )]  # fmt: skip
    return "\n".join(lines) + "\n"


def write(result: TextStudyResult, folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    write_csv([r for p in result.points for r in p.records], folder / "text_records.csv")
    figures = {
        "rate": result.rate, "raw": result.raw, "sentence_transformers": result.sentence_transformers,
        "latency": result.latency, "plan": asdict(replace(result.plan)),
        "points": [{**{k: v for k, v in asdict(p).items() if k != "records"}, "mean_batch": p.mean_batch}
                   for p in result.points],
        "goals": [asdict(g) for g in goals(result)],
    }  # fmt: skip
    (folder / "text_embedding.json").write_text(json.dumps(figures, indent=2, default=str))
    path = folder / "text_embedding.md"
    path.write_text(report(result))
    return path


def run_text_study(profile: str, folder: Path) -> Path | None:
    """The study for a ``make perf`` profile (None for profiles without one); returns the report."""
    plan = PLANS.get(profile)
    if plan is None:
        return None
    return write(run(plan, folder), folder)

"""The text-embedding study: how variable-length text batches, all-MiniLM-L6-v2 served in each of the
profile's ``text_modes`` under one deterministic corpus, beside in-process references (docs/TEXT.md)."""

from __future__ import annotations

import asyncio
import math
import re
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from client.text_reference import text_array
from exporters.schema.text_embeddings import DEFAULT_BUCKETS, DEFAULT_PACKAGE, TextEmbeddingSpec
from exporters.text.embedding import build_text_embedding, model_folder
from perf.markdown import number, ratio, table
from perf.measure.loads import Load, closed_loop
from perf.measure.measurement import Measurement, measure_async
from perf.measure.raw import measure_raw
from perf.measure.records import Record, Summary, write_csv
from perf.measure.target import Target
from perf.model.latency import fit_latency
from perf.studies.framework import StudyContext, StudyReport, write_report
from perf.studies.goals import GOALS, Goal, goals_table
from perf.studies.profiles import Profile
from perf.studies.study_spec import INT8, TEXT_MODES, TEXT_TITLES, TextMode
from python_backend.onnxruntime.ort_session import open_session
from python_backend.text_tokenizer.tokens import TextTokenizer
from server import TritonServer

EMBEDDING_BYTES = 384 * 4
SHARE_FRACTION = 0.3  # short-query rate in the sharing phase / the bucketed mode's short-query capacity
PASSAGES_IN_FLIGHT = 2  # long passages kept in flight while short queries are measured
METRIC_LINE = re.compile(r"^(\w+)\{([^}]*)\}\s+([0-9.eE+-]+)$")  # a Prometheus sample with labels
LATENCY_BATCHES = (1, 4, 16)  # batch sizes of the latency model per padded length (and raw references)
SHARING = ("queries alone", "queries shared", "passages")  # the sharing phase's streams

# the corpus's vocabulary, the commonest English words first: data, one word a line
WORDS = Path(__file__).with_name("corpus_words.txt").read_text().split()
KINDS = {  # kind: (share of the corpus, fewest words, most words)
    "query": (0.6, 3, 10),
    "sentence": (0.25, 12, 30),
    "passage": (0.15, 90, 200),
}


@dataclass(frozen=True)
class CorpusText:
    text: str
    kind: str  # query | sentence | passage


def make_corpus(size: int, seed: int = 0) -> list[CorpusText]:
    """``size`` texts drawn with ``seed``: kinds by their share, lengths uniform within each kind."""
    rng = np.random.default_rng(seed)
    shares = np.array([share for share, _, _ in KINDS.values()])
    corpus = []
    for kind in rng.choice(list(KINDS), size=size, p=shares / shares.sum()):
        low, high = KINDS[kind][1:]
        text = " ".join(rng.choice(WORDS, size=int(rng.integers(low, high + 1))))
        corpus.append(CorpusText(text[0].upper() + text[1:] + ("?" if kind == "query" else "."), str(kind)))
    return corpus


def raw_onnxruntime(
    onnx_path: str, tokenizer: TextTokenizer, corpus: Sequence[CorpusText], batch: int
) -> tuple[float, float]:
    """(sentences/s, computed/real tokens) in-process, one thread, tokenization timed: texts grouped by
    padded length and run ``batch`` at a time, as the dynamic batcher groups them; best of two passes."""
    session = open_session(onnx_path, 1, 1, ["CPUExecutionProvider"])
    texts = [c.text for c in corpus]

    def one_pass() -> tuple[float, int, int]:
        start = time.perf_counter()
        encoded = tokenizer.tokenize([[t] for t in texts])
        by_width: dict[int, list] = {}
        for item in encoded:
            by_width.setdefault(item.input_ids.shape[1], []).append(item)
        real = computed = 0
        for items in by_width.values():
            for first in range(0, len(items), batch):
                group = items[first : first + batch]
                ids = np.concatenate([g.input_ids for g in group])
                mask = np.concatenate([g.attention_mask for g in group])
                session.run(["embedding"], {"input_ids": ids, "attention_mask": mask})
                real += sum(g.real_tokens for g in group)
                computed += ids.size
        return time.perf_counter() - start, real, computed

    ones = np.ones((1, 8), np.int64)
    session.run(["embedding"], {"input_ids": ones, "attention_mask": ones})  # warm-up
    best, real, computed = min(one_pass() for _ in range(2))
    return len(texts) / best, computed / real


def sentence_transformers_rate(package: str, corpus: Sequence[CorpusText], batch: int = 32) -> float:
    """Sentences/s of ``SentenceTransformer.encode`` in-process, what a user runs instead."""
    from client.text_reference import sentence_transformer

    model = sentence_transformer(package)
    texts = [c.text for c in corpus]
    model.encode(texts[:batch], batch_size=batch, normalize_embeddings=True)
    start = time.perf_counter()
    model.encode(texts, batch_size=batch, normalize_embeddings=True)
    return len(texts) / (time.perf_counter() - start)


def bucket_latency(
    onnx_path: str, lengths: Sequence[int], batches: Sequence[int]
) -> dict[int, dict[int, float]]:
    """``{padded length: {batch: median ms}}`` in-process, timed as ``measure_raw`` times."""
    rng = np.random.default_rng(0)
    latency = {}
    for length in lengths:
        shape = (max(batches), length)
        ids = rng.integers(1000, 20000, size=shape, dtype=np.int64)
        pool = {"input_ids": ids, "attention_mask": np.ones(shape, dtype=np.int64)}
        points = measure_raw(Path(onnx_path), pool, batches, seconds=0.2, repeats=3)
        latency[length] = {point.batch: point.batch_ms for point in points}
    return latency


@dataclass
class Point:
    """One measurement: a mode under a load, with the encoder's view of it."""

    mode: str
    load: str
    summary: Summary
    sent: int
    failed: int
    formed: dict[int, int]  # encoder batch size -> executions (measured windows)
    padding_waste: float  # computed tokens / real tokens

    @property
    def mean_batch(self) -> float:
        executions = sum(self.formed.values())
        return sum(s * n for s, n in self.formed.items()) / executions if executions else math.nan

    def speed_cells(self) -> list[str]:
        """Sentences/s, p50 and p99, as every table of the report shows them."""
        return [number(self.summary.throughput), number(self.summary.p50_ms), number(self.summary.p99_ms)]


@dataclass
class TextResult:
    profile: Profile
    points: list[Point] = field(default_factory=list)
    rate: float = 0.0
    raw: dict[str, list[float]] = field(default_factory=dict)  # label -> [batch, sentences/s, waste]
    sentence_transformers: float = math.nan
    latency: dict[int, dict[int, float]] = field(default_factory=dict)
    records: list[Record] = field(repr=False, default_factory=list)  # every point's, for text_records.csv

    def point(self, mode: str, load: str) -> Point | None:
        return next((p for p in self.points if p.mode == mode and p.load == load), None)

    def add(self, mode: str, load: str, measurement: Measurement, encoder: str, waste: float) -> None:
        """``measurement`` as a point with the encoder's formed batches, its records kept."""
        stats = measurement.server.related.get(encoder) if measurement.server else None
        formed = {s: b.executions for s, b in stats.batches.items() if b.executions} if stats else {}
        failed, summary = sum(not r.ok for r in measurement.records), measurement.summary()
        self.points.append(Point(mode, load, summary, measurement.attempts, failed, formed, waste))
        self.records += measurement.records


def token_counters(metrics: str, model: str) -> dict[str, float]:
    """``{"metric:kind": value}`` of this project's token counters for ``model``."""
    values: dict[str, float] = {}
    for line in metrics.splitlines():
        match = METRIC_LINE.match(line.strip())
        if not match or match.group(1) not in ("text_tokens_total", "ragged_batch_elements_total"):
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', match.group(2)))
        if labels.get("model") == model:
            values[f"{match.group(1)}:{labels.get('kind')}"] = float(match.group(3))
    return values


def read_counters(server: TritonServer, spec: TextEmbeddingSpec) -> dict[str, float]:
    with urllib.request.urlopen(server.metrics_url, timeout=10) as response:
        metrics = response.read().decode()
    return token_counters(metrics, spec.tokenizer_name) | token_counters(metrics, spec.encoder_name)


def padding_waste(before: dict[str, float], after: dict[str, float]) -> float:
    """Computed / real tokens: the ragged encoder's where it pads, else the tokenizer's."""
    diff = {key: after[key] - before.get(key, 0.0) for key in after}
    real = diff.get("text_tokens_total:real", 0.0)
    computed = diff.get("ragged_batch_elements_total:computed") or diff.get("text_tokens_total:padded", 0.0)
    return computed / real if real else math.nan


def _target(context: StudyContext, server: TritonServer, model: str, corpus: list[CorpusText]) -> Target:
    inputs = {"text": text_array([c.text for c in corpus])}
    outputs = {"embedding": EMBEDDING_BYTES}
    return Target(model, context.url(server), inputs, outputs, context.profile.protocol, cycle=True)


def measure_mode(
    context: StudyContext, server: TritonServer, result: TextResult, mode: TextMode, corpus: list[CorpusText],
    load: Load, name: str,
) -> None:  # fmt: skip
    spec = mode.spec()
    target = _target(context, server, spec.name, corpus)
    related = (spec.encoder_name, spec.tokenizer_name)
    before = read_counters(server, spec)
    measurement = context.measure(server, target, load, f"{spec.name} {name}", related=related)
    waste = padding_waste(before, read_counters(server, spec))
    result.add(mode.name, name, measurement, spec.encoder_name, waste)


def measure_sharing(
    context: StudyContext, server: TritonServer, result: TextResult, mode: TextMode,
    queries: list[CorpusText], passages: list[CorpusText], load: Load,
) -> None:  # fmt: skip
    """Short queries (open loop) while long passages keep the same server busy (closed loop)."""
    spec, settings = mode.spec(), context.profile.settings
    context.progress(f"{spec.name}: short queries with long passages sharing")
    queries_target, passages_target = (_target(context, server, spec.name, t) for t in (queries, passages))

    async def both() -> list[Measurement]:
        return await asyncio.gather(
            measure_async(queries_target, load, settings, label="queries shared"),
            measure_async(passages_target, closed_loop(PASSAGES_IN_FLIGHT), settings, label="passages"),
        )

    before = read_counters(server, spec)
    shared, busy = asyncio.run(both())
    waste = padding_waste(before, read_counters(server, spec))
    for measurement in (shared, busy):
        result.add(mode.name, measurement.label, measurement, "", waste)


def compares_int8(profile: Profile) -> bool:
    """Whether the study serves the int8 encoder beside the fp32 ``buckets`` mode."""
    return profile.text_int8 and "buckets" in profile.text_modes


def encoder_file(repository: Path, mode: TextMode) -> Path:
    return repository / mode.spec().encoder_name / "1" / "model.onnx"


def served_batch(result: TextResult) -> int:
    """The mean batch the served bucketed encoder formed (0: unmeasured): raw is compared there."""
    served = result.point("buckets", "closed mixed")
    return max(1, round(served.mean_batch)) if served and served.formed else 0


def int8_batch(result: TextResult) -> int:
    """The batch int8 and fp32 are compared at raw: the one the served fp32 encoder formed."""
    return served_batch(result) or max(LATENCY_BATCHES)


def measure_references(
    profile: Profile, result: TextResult, corpus: list[CorpusText], repository: Path, modes: list[TextMode]
) -> None:
    """In-process references on the corpus's first texts (server stopped: they get the cores)."""
    corpus = corpus[: profile.text_reference_texts]
    onnx = str(encoder_file(repository, modes[0]))
    tokenizer_path = str(model_folder(DEFAULT_PACKAGE) / "tokenizer.json")
    bucketed, exact = TextTokenizer(tokenizer_path, 256, DEFAULT_BUCKETS), TextTokenizer(tokenizer_path, 256)
    batches = sorted({1, served_batch(result) or 1, max(LATENCY_BATCHES)})
    references = [("buckets", onnx, bucketed, batch) for batch in batches]  # (label, file, tokenizer, batch)
    if compares_int8(profile):
        references.append(("int8 buckets", str(encoder_file(repository, INT8)), bucketed, int8_batch(result)))
    references.append(("exact lengths", onnx, exact, 1))
    for label, path, tokenizer, batch in references:
        result.raw[f"{label}, batch {batch}"] = [batch, *raw_onnxruntime(path, tokenizer, corpus, batch)]
    result.sentence_transformers = sentence_transformers_rate(DEFAULT_PACKAGE, corpus)
    lengths = DEFAULT_BUCKETS if len(profile.text_modes) > 3 else (16, 64, 256)
    result.latency = bucket_latency(onnx, lengths, LATENCY_BATCHES)


class TextStudy:
    name = "text_embedding"
    title = "text-embedding study (all-MiniLM-L6-v2: no batching, exact lengths, buckets, padded to longest)"
    serves_spec = False

    def steps(self, profile: Profile) -> int:
        modes = len(profile.text_modes)
        if not modes:
            return 0
        return 2 + 3 * modes - ("exact" in profile.text_modes) + 2 + 1 + compares_int8(profile)

    def run(self, context: StudyContext) -> StudyReport:
        profile = context.profile
        modes = [TEXT_MODES[name] for name in profile.text_modes]
        repository = context.workdir / "text_repository"  # kept: a rebuild reuses the exported encoder
        context.progress("building the text study repository (encoder exported once)")
        done: dict[str, Path] = {}  # one ensemble per mode, the fp32 ones sharing one exported encoder file
        for mode in [*modes, INT8] if compares_int8(profile) else modes:
            build_text_embedding(mode.spec(), repository, num_gpus=0, ragged=mode.ragged, done=done)
        corpus = make_corpus(profile.text_corpus, seed=profile.seed)
        queries = [c for c in corpus if c.kind == "query"]
        passages = [c for c in corpus if c.kind == "passage"]
        result = TextResult(profile)
        context.progress("starting tritonserver")
        with context.server(repository, "text-server.log", startup_timeout_s=300) as server:
            saturate = closed_loop(profile.goal_concurrency)
            for mode in modes:
                measure_mode(context, server, result, mode, corpus, saturate, "closed mixed")
                if mode.name != "exact":  # short queries rarely share a length: exact is no batching there
                    measure_mode(context, server, result, mode, queries, saturate, "closed queries")
            if compares_int8(profile):
                measure_mode(context, server, result, INT8, corpus, saturate, "closed mixed")
            anchor = result.point("buckets", "closed mixed") or result.points[0]
            result.rate = max(profile.poisson_fraction * anchor.summary.throughput, 1.0)
            for mode in modes:
                load = context.open_load(result.rate)
                measure_mode(context, server, result, mode, corpus, load, "open mixed")
            shared_mode = TEXT_MODES["buckets"] if "buckets" in profile.text_modes else modes[0]
            short = result.point(shared_mode.name, "closed queries")
            load = context.open_load(max(SHARE_FRACTION * short.summary.throughput, 1.0), seed_offset=1)
            measure_mode(context, server, result, shared_mode, queries, load, "queries alone")
            measure_sharing(context, server, result, shared_mode, queries, passages, load)
        context.progress("references in-process: raw onnxruntime, sentence-transformers, latency per length")
        measure_references(profile, result, corpus, repository, modes)
        write_csv(result.records, context.folder / "text_records.csv")
        figures = {
            "rate": result.rate, "raw": result.raw, "sentence_transformers": result.sentence_transformers,
            "latency": result.latency,
            "points": [asdict(p) | {"mean_batch": p.mean_batch} for p in result.points],
        }  # fmt: skip
        return write_report(context, self, report_lines(result), goals(result), figures)


def ratio_goal(name: str, value: float, detail: str, limits: str) -> Goal:
    """``name``'s goal judged on ``value``, a ratio within the run."""
    spec = GOALS[name]
    return spec.outcome(f"{ratio(value)} {detail}", spec.met(value), limits)


def served_vs_raw(result: TextResult) -> Goal:
    served, batch = result.point("buckets", "closed mixed"), served_batch(result)
    raw = result.raw.get(f"buckets, batch {batch}")
    if not served or raw is None:
        return GOALS["text served vs raw"].outcome()
    rate = served.summary.throughput
    return ratio_goal(
        "text served vs raw", rate / raw[1], f"({rate:.1f} vs {raw[1]:.1f} sentences/s at batch {batch})",
        "raw runs in-process, tokenization included; serving adds gRPC, the ensemble and two Python-backend "
        "hops, on the same cores as the client",
    )  # fmt: skip


def dynamic_vs_none(result: TextResult) -> Goal:
    none, dyn = result.point("none", "closed queries"), result.point("buckets", "closed queries")
    if not none or not dyn:
        return GOALS["text dynamic vs none"].outcome()
    rate, base = dyn.summary.throughput, none.summary.throughput
    detail = (
        f"({rate:.1f} vs {base:.1f} sentences/s, mean formed batch {number(dyn.mean_batch)} vs "
        f"{number(none.mean_batch)})"
    )
    return ratio_goal("text dynamic vs none", rate / base, detail, _batching_limits(result, dyn))


def _batching_limits(result: TextResult, dyn: Point) -> str:
    """Why batching buys little here: Δt against T at the short queries' length, and the padding."""
    points = result.latency.get(min(result.latency, default=0), {})
    if len(points) < 2:
        return ""
    fit = fit_latency(points)
    return (
        f"compute-bound on CPU: at length {min(result.latency)} each extra sample costs "
        f"Δt = {fit.dt_ms:.1f} ms vs T = {fit.t_ms:.1f} ms for a batch of one (model gain at batch 16: "
        f"{ratio(fit.throughput(16) / fit.throughput(1))}), and buckets pad short queries "
        f"{ratio(dyn.padding_waste)}"
    )


def sharing(result: TextResult) -> Goal:
    alone, shared = (next((p for p in result.points if p.load == load), None) for load in SHARING[:2])
    if not alone or not shared:
        return GOALS["text short-query p99 shared"].outcome()
    p99, base = shared.summary.p99_ms, alone.summary.p99_ms
    return ratio_goal(
        "text short-query p99 shared", p99 / base, f"(p99 {number(p99)} ms shared vs {number(base)})",
        "one encoder instance: a query waits behind a running batch of long passages (head-of-line)",
    )  # fmt: skip


def int8_vs_fp32(result: TextResult) -> Goal:
    """Reported, not required of a run: int8's raw speed over fp32's at the same batch."""
    batch = int8_batch(result)
    int8, fp32 = result.raw.get(f"int8 buckets, batch {batch}"), result.raw.get(f"buckets, batch {batch}")
    if int8 is None or fp32 is None:
        return GOALS["text int8 vs fp32"].outcome()
    detail = f"raw ({int8[1]:.1f} vs {fp32[1]:.1f} sentences/s at batch {batch})"
    served, served_fp32 = result.point("int8", "closed mixed"), result.point("buckets", "closed mixed")
    if served and served_fp32:
        rate, base = served.summary.throughput, served_fp32.summary.throughput
        detail += f"; served {ratio(rate / base)} ({rate:.1f} vs {base:.1f})"
    limits = (
        "int8: MatMul weights int8, activations quantized at run time, outlier channels fp32; attention, "
        "softmax and LayerNorm stay fp32, and served, the tokenizer and the hops cost the same"
    )
    return ratio_goal("text int8 vs fp32", int8[1] / fp32[1], detail, limits)


def goals(result: TextResult) -> list[Goal]:
    listed = [served_vs_raw(result), dynamic_vs_none(result), sharing(result)]
    return [*listed, int8_vs_fp32(result)] if compares_int8(result.profile) else listed


HEADER = ["mode", "sentences/s", "p50 ms", "p99 ms", "mean formed batch", "padding waste", "failed/sent",
          "×none"]  # fmt: skip


def _rows(result: TextResult, load: str) -> list[list[str]]:
    base = result.point("none", load)
    rows = []
    for point in (p for p in result.points if p.load == load):
        gain = point.summary.throughput / base.summary.throughput if base else math.nan
        rows.append([
            TEXT_TITLES[point.mode], *point.speed_cells(), number(point.mean_batch, 2),
            ratio(point.padding_waste), f"{point.failed}/{point.sent}", ratio(gain),
        ])  # fmt: skip
    return rows


def section(title: str, body: str) -> list[str]:
    return ["", f"## {title}", "", body]


def report_lines(result: TextResult) -> list[str]:
    profile = result.profile
    lines = [
        "# Text embedding study (all-MiniLM-L6-v2)",
        "",
        f"Corpus: {profile.text_corpus} deterministic texts (about 60% queries of 3–10 words, 25% sentences "
        f"of 12–30, 15% passages of 90–200); one text per request over {profile.protocol}. Padding waste = "
        "computed / real tokens. Formed batches are the encoder's, over the measured windows.",
    ]
    for load, title in (
        ("closed mixed", f"Closed loop, concurrency {profile.goal_concurrency}, mixed corpus"),
        ("closed queries", f"Closed loop, concurrency {profile.goal_concurrency}, short queries only"),
        ("open mixed", f"Open loop at {result.rate:.1f}/s (same arrivals for every mode), mixed corpus"),
    ):
        lines += section(title, table(HEADER, _rows(result, load)))
    streams = [[p.load, *p.speed_cells(), f"{p.failed}/{p.sent}"] for p in result.points if p.load in SHARING]
    lines += section(
        "Short queries alone, and with long passages sharing the server (dynamic + buckets)",
        table(["stream", "sentences/s", "p50 ms", "p99 ms", "failed/sent"], streams),
    )
    refs = [
        [f"raw onnxruntime in-process ({label})", number(v[1]), ratio(v[2])]
        for label, v in result.raw.items()
    ]
    refs.append(
        ["sentence-transformers encode(batch_size=32) in-process", number(result.sentence_transformers), "–"]
    )
    lines += section(
        f"References (same run, server stopped, first {profile.text_reference_texts} texts, tokenization "
        "included)",
        table(["reference", "sentences/s", "padding waste"], refs),
    )
    fits = []
    for length, points in sorted(result.latency.items()):
        fit, top = fit_latency(points), max(points)
        gain = ratio(fit.throughput(top) / fit.throughput(1))
        fits.append([length, number(fit.t_ms, 2), number(fit.dt_ms, 2), f"{fit.r2:.3f}", gain, top])
    lines += section(
        "Latency model per padded length: T_batch(N) = T + (N−1)·Δt (raw onnxruntime, 1 thread)",
        table(["length", "T ms", "Δt ms", "R²", "predicted gain at the top batch", "top batch"], fits),
    )
    return lines + section("Goals", goals_table(goals(result)))

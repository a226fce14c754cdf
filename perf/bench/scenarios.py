"""The article's two scenarios as tuner presets (``python -m perf tune --scenario video|recsys``).

* **video**: N camera streams at 30 frames/s (periodic per stream, random phase, Gaussian jitter), the
  image classifier in fp16, p99 ≤ 15 ms. How many streams does one instance serve without batching,
  and with the tuned dynamic batching? (The article: per-card QPS 15 → 58 with a 10 ms delay, under
  15 ms.)
* **recsys**: bursty traffic (Poisson within a rate step ×3), Zipf-distributed ids, the recommender.
  Throughput and p99 of tuned batching vs no batching (the article: 3.2× throughput, p99 −41%).

Each answer is predicted by the batcher simulation from a probe, then measured on the real server at
the predicted operating points.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import yaml

from exporters.schema.models import ModelSpec, Spec, parse_spec
from exporters.sources.inputs import draw_inputs
from perf.errors import OptionError
from perf.markdown import number, table, write_report
from perf.measure.engine import LoadEngine, MeasureSettings
from perf.measure.loads import Load
from perf.model.batcher import BatcherConfig
from perf.model.grid import MAX_BATCH
from perf.model.predict import Prediction, max_rate
from perf.session.model import TUNE_WINDOWS, ModelSession
from perf.session.probe import ProbePlan, ProbeResult, probe
from perf.tune.tuner import Point, TuneRequest, measure_point, predict_point

FPS = 30.0
VIDEO_DELAYS_US = (0, 1000, 2000, 5000, 10000)
RECSYS_DELAYS_US = (0, 500, 1000, 2000, 5000)
# Short on purpose: the scenario is a probe and a few points, not a study (≈ 1 min per model).
SCENARIO_PROBE = ProbePlan(max_runs=6)
ZIPF_POOL_ROWS = 4096  # distinct samples the recsys load cycles through (each request the next rows)
SCENARIOS = ("video", "recsys")


@dataclass(frozen=True)
class ScenarioOptions:
    """What ``--scenario`` runs with, checked before any server starts or report folder is made
    (``perf.bench.cli`` builds it from the command line). ``p99_ms`` None: the scenario's own budget;
    ``model``: the recsys scenario's (video serves the image classifier in fp16 whatever it says)."""

    scenario: str
    spec: Path = Path("models.yaml")
    p99_ms: float | None = None
    model: str = "recommender"
    seed: int = 0

    def __post_init__(self) -> None:
        if self.scenario not in SCENARIOS:
            raise OptionError(f"--scenario must be one of {', '.join(SCENARIOS)}, got {self.scenario!r}")
        if self.p99_ms is not None and self.p99_ms <= 0:
            raise OptionError(f"--p99-ms must be > 0, got {self.p99_ms}")
        if not self.model:
            raise OptionError("--model must name a model of the spec, got ''")
        if self.seed < 0:  # numpy's generators take no negative seed
            raise OptionError(f"--seed must be >= 0, got {self.seed}")

    @property
    def video(self) -> bool:
        return self.scenario == "video"

    @property
    def budget_ms(self) -> float:
        """``--p99-ms``, or the article's budget for the scenario: 15 ms for video, 10 ms for recsys."""
        if self.p99_ms is not None:
            return self.p99_ms
        return 15.0 if self.video else 10.0


def video_load(
    streams: int, fps: float = FPS, jitter_ms: float = 1.0, seed: int = 0, seconds: float = 120
) -> Load:
    """``streams`` periodic streams at ``fps`` with random phases and Gaussian jitter (``jitter_ms``)."""
    if streams < 1:
        raise OptionError(f"streams must be >= 1, got {streams}")

    def arrivals() -> Iterator[float]:
        rng = np.random.default_rng(seed)
        frames = np.arange(int(seconds * fps)) / fps
        phases = rng.uniform(0, 1 / fps, streams)
        times = (phases[:, None] + frames[None, :]).ravel()
        times = np.sort(np.maximum(0.0, times + rng.normal(0, jitter_ms / 1e3, times.size)))
        return iter(times.tolist())

    return Load("open", f"{streams} streams × {fps:g} fps", rate=streams * fps, arrivals=arrivals)


def streams_load(rate: float, seed: int = 0) -> Load:
    return video_load(max(1, round(rate / FPS)), seed=seed)


def step_load(
    rate: float, seed: int = 0, phase_s: float = 2.0, step: float = 3.0, seconds: float = 120
) -> Load:
    """Mean ``rate``, alternating phases of ``phase_s`` at a low rate and ``step``× that rate, Poisson
    within each phase (the bursty recommendation traffic)."""
    low = 2 * rate / (1 + step)

    def arrivals() -> Iterator[float]:
        # lazy: a prediction takes the first seconds only, and is made for many rates
        rng = np.random.default_rng(seed)
        now, phase = 0.0, 0
        while now < seconds:
            current = low * (step if phase % 2 else 1.0)
            end = (phase + 1) * phase_s
            while True:
                now += rng.exponential(1 / current)
                if now >= end:
                    now = end
                    break
                yield now
            phase += 1

    return Load("open", f"step ×{step:g} around {rate:.0f}/s", rate=rate, arrivals=arrivals)


def recsys_load(rate: float, seed: int, window_s: float) -> Load:
    """The recsys step load with one low and one high phase per measured window of ``window_s``, so
    each point sends the rate it is labelled with (2 s phases in 3 s windows sent 5/6 of it)."""
    return step_load(rate, seed, phase_s=window_s / 2)


def zipf_ids(table_sizes: list[int], rows: int, exponent: float = 1.2, seed: int = 0) -> np.ndarray:
    """Ids drawn from a Zipf law per table (rank 1 the most popular), folded into each table's range."""
    rng = np.random.default_rng(seed)
    columns = [(rng.zipf(exponent, rows) - 1) % size for size in table_sizes]
    return np.stack(columns, axis=1).astype(np.int64)


@dataclass
class Verdict:
    label: str
    config: BatcherConfig
    predicted: Prediction | None  # the highest rate predicted within the budget
    points: list[Point]
    budget_ms: float

    def at(self, rate: float) -> Point | None:
        return next((p for p in self.points if abs(p.rate - rate) < 1e-6), None)

    @property
    def measured_rate(self) -> float:
        """The highest rate measured within the budget (0: none was)."""
        met = [p.rate for p in self.points if p.measured and p.measured.meets(self.budget_ms)]
        return max(met, default=0.0)


def _best(
    probe_result: ProbeResult,
    budget: float,
    delays: tuple[int, ...],
    load_at: Callable[[float], Load],
    max_batch: int = MAX_BATCH,
) -> tuple[Prediction | None, Prediction | None]:
    """(no batching, the best dynamic batching) by predicted highest rate within the budget."""
    service = probe_result.services[1]
    single = max_rate(BatcherConfig(1), service, budget, load_at)
    dynamic = [
        max_rate(BatcherConfig(max_batch, d), service, budget, load_at) for d in delays if d / 1e3 < budget
    ]
    found = [p for p in dynamic if p is not None]
    return single, max(found, key=lambda p: p.rate) if found else None


def _video_spec(document: dict) -> tuple[dict, str]:
    entry = copy.deepcopy(next(m for m in document["models"] if m["name"] == "image_classifier"))
    name = "image_classifier_fp16"
    entry.update(name=name, precision="fp16")
    for tensor in [*entry["inputs"], *entry["outputs"]]:
        tensor["dtype"] = "fp16"
    entry["batching"] = {"mode": "dynamic", "max_queue_delay_us": 0}
    document = {"models": [entry]}
    return document, name


def _row(verdict: Verdict, unit: Callable[[float], str]) -> list[str]:
    p = verdict.predicted
    top = verdict.at(p.rate) if p else None
    m = top.measured if top else None
    return [
        verdict.label,
        verdict.config.label,
        unit(p.rate) if p else "none within budget",
        number(p.p99_ms) if p else "–",
        unit(verdict.measured_rate) if p else "–",
        number(m.p99_ms) if m else "–",
        number(m.stats.mean_batch) if m else "–",
        f"{m.figures.failed}/{m.figures.requests}" if m else "–",
    ]


HEADER = [
    "",
    "config",
    "predicted max",
    "pred p99 there (ms)",
    "measured max",
    "meas p99 at predicted max (ms)",
    "meas mean batch",
    "failed/sent",
]


@dataclass
class ModelOutcome:
    """One model's part of a scenario: the probe it was predicted from, and its verdicts."""

    model: str
    measured: ProbeResult
    verdicts: list[Verdict]
    reload_s: list[float]
    noise: dict = field(default_factory=dict)  # ``perf.measure.noise.NoisePolicy.figures`` of its session


def scenario_models(spec: Spec, model: str) -> list[str]:
    """The models a recsys run measures: a pipeline comes with the monolithic model it splits, so one
    report holds both (each on its own server, one after the other)."""
    names = {p.name for p in spec.pipelines}
    return [spec.pipeline(model).model, model] if model in names else [model]


def _session(
    spec: Spec, model: str, engine: LoadEngine, seed: int, settings: MeasureSettings
) -> ModelSession:
    workdir = Path(".run/tune")
    if model in {p.name for p in spec.pipelines}:
        from perf.session.pipeline import PipelineSession

        return PipelineSession(spec, model, MAX_BATCH, workdir / "pipeline", engine, settings, seed=seed)
    return ModelSession(spec, model, MAX_BATCH, workdir, engine, settings, seed=seed)


def measure_model(
    spec: Spec,
    model: str,
    request: TuneRequest,
    delays: tuple[int, ...],
    engine: LoadEngine,
    console,
    plan: ProbePlan = SCENARIO_PROBE,
    zipf: bool = False,
    article_delay_us: int | None = None,
    settings: MeasureSettings = TUNE_WINDOWS,
) -> ModelOutcome:
    """Probe ``model``, predict no batching vs the best delay (and the article's), measure each at its
    predicted highest rate and at 80% of it."""
    budget, load_at = request.budget_ms, request.load
    with _session(spec, model, engine, request.seed, settings) as session:
        # A pipeline's stages keep the batch limit they were built with (an ensemble's max_batch_size
        # may not exceed a stage's), so its candidates use that limit; a model's use MAX_BATCH.
        pipeline = model != session.base.name
        max_batch = session.largest_batch if pipeline else MAX_BATCH
        if zipf:
            session.cycle_through(_zipf_pool(session.base, request.seed))
        console.print(f"  {model}: probing the service model")
        measured = probe(session, (1,), max_batch, plan)
        single, tuned = _best(measured, budget, delays, load_at, max_batch)
        candidates = [("no batching", BatcherConfig(1), single), ("tuned dynamic batching", None, tuned)]
        if article_delay_us is not None:  # the article's own setting, for the comparison
            article = BatcherConfig(max_batch, article_delay_us)
            found = max_rate(article, measured.services[1], budget, load_at)
            candidates.append((f"the article's {article_delay_us / 1e3:g} ms delay", article, found))
        verdicts = []
        for label, config, found in candidates:
            config = found.config if found else (config or BatcherConfig(max_batch))
            rates = sorted({found.rate, 0.8 * found.rate}) if found else []
            if zipf and single and label.startswith("tuned"):
                # p99 of tuned and none at the same rate; with no delay predicted within the budget, the
                # delay-0 batcher is the one measured there
                rates.append(single.rate)
            points = [predict_point(measured, request, config, rate) for rate in rates]
            verdicts.append(Verdict(label, config, found, points, budget))
        console.print(f"  {model}: measuring")
        for verdict in verdicts:
            session.prepare(verdict.config)
            for point in verdict.points:
                measure_point(session, request, point, "scenario")
        return ModelOutcome(model, measured, verdicts, list(session.reload_s), session.noise.figures())


def run_scenario(
    options: ScenarioOptions, folder: Path, console, engine: LoadEngine, settings: MeasureSettings
) -> int:
    document = yaml.safe_load(options.spec.read_text())
    video, budget = options.video, options.budget_ms
    if video:
        document, model = _video_spec(document)
        load_at = lambda rate: streams_load(rate, options.seed)  # noqa: E731
        delays = VIDEO_DELAYS_US
    else:
        model = options.model
        load_at = lambda rate: recsys_load(rate, options.seed, settings.window_s)  # noqa: E731
        delays = RECSYS_DELAYS_US
    spec = parse_spec(document)
    models = [model] if video else scenario_models(spec, model)
    request = TuneRequest(budget, None, seed=options.seed, load_at=load_at)
    console.print(f"scenario {options.scenario}: {', '.join(models)}, p99 ≤ {budget:g} ms → {folder}")
    outcomes = [
        measure_model(
            spec,
            name,
            request,
            delays,
            engine,
            console,
            zipf=not video,
            article_delay_us=10_000 if video else None,
            settings=settings,
        )
        for name in models
    ]
    report = write_scenario(options.scenario, folder, budget, outcomes, engine.name)
    console.print(report.read_text(), highlight=False, markup=False)
    return 0


def _zipf_pool(spec: ModelSpec, seed: int, rows: int = ZIPF_POOL_ROWS) -> dict[str, np.ndarray]:
    """``rows`` samples the load cycles through: the spec's inputs drawn as usual, ids from Zipf."""
    from exporters.zoo.recommender import build_recommender

    pool = dict(zip((t.name for t in spec.inputs), draw_inputs(spec, rows, seed), strict=True))
    pool["sparse_ids"] = zipf_ids(build_recommender(**spec.options).table_sizes, rows, seed=seed)
    return pool


def _ratio(a: float, b: float) -> float:
    return a / b if a and b else float("nan")


def _section(outcome: ModelOutcome, unit: Callable[[float], str], recsys: bool) -> tuple[list[str], dict]:
    """One model's lines of the report and its figures."""
    verdicts, measured = outcome.verdicts, outcome.measured
    single, tuned = verdicts[0], verdicts[1]
    pred_gain = _ratio(
        tuned.predicted.rate if tuned.predicted else 0, single.predicted.rate if single.predicted else 0
    )
    # a tuned configuration measured only at no batching's rate has no highest rate of its own
    meas_gain = _ratio(tuned.measured_rate, single.measured_rate) if tuned.predicted else float("nan")
    fit = measured.fits[1]
    runs = [p.measured for v in verdicts for p in v.points if p.measured]
    sent = sum(len(run.records) for run in runs)
    failed_all = sum(not r.ok for run in runs for r in run.records)
    shed = sum(r.shed for run in runs for r in run.records)
    lines = [
        f"## {outcome.model}",
        "",
        f"Service model: T {fit.t_ms:.2f} ms, Δt {fit.dt_ms:.3f} ms (R² {fit.r2:.3f}), per-execution + "
        f"per-request cost when saturated {measured.per_batch_ms:.3f} + {measured.per_request_ms[1]:.3f} ms; "
        f"single-request p99 floor {measured.floor_p99_ms:.1f} ms. Reloads: "
        f"{', '.join(f'{s:.1f}' for s in outcome.reload_s)} s.",
        "",
        table(HEADER, [_row(v, unit) for v in verdicts]),
        "",
        "Highest rate within the budget, tuned / no batching: "
        f"predicted {_times(pred_gain)}, measured {_times(meas_gain)}. Failed requests over every measured "
        f"run: {failed_all} of {sent}"
        + (f" ({shed} of them shed by the client's in-flight bound)." if shed else "."),
    ]
    saturated, unbatched = measured.saturation.get(1), measured.saturation.get(0)
    if saturated and unbatched:
        figures_saturation = {
            "batched": saturated.throughput,
            "batched_mean_batch": saturated.stats.mean_batch,
            "unbatched": unbatched.throughput,
            "gain": _ratio(saturated.throughput, unbatched.throughput),
        }
        lines.append(
            f"Served at saturation (the probe's overload runs, no budget): batching with delay 0 "
            f"{saturated.throughput:.0f}/s (mean batch {saturated.stats.mean_batch:.1f}) vs no batching "
            f"{unbatched.throughput:.0f}/s: {figures_saturation['gain']:.2f}×."
        )
    if tuned.points and not tuned.measured_rate:
        lines.append("Tuned batching met the budget at none of its measured rates.")
    if single.points and not single.measured_rate and tuned.measured_rate and tuned.predicted:
        lowest = min(p.rate for p in single.points)
        lines.append(
            f"No batching met the budget at none of its measured rates (lowest {unit(lowest)}): "
            f"measured gain at least {tuned.measured_rate / lowest:.2f}×."
        )
    figures: dict = {
        "predicted_gain": pred_gain,
        "measured_gain": meas_gain,
        "failed": failed_all,
        "shed": shed,
        "sent": sent,
        "rows": {
            v.label: {
                "config": v.config.label,
                "predicted": v.predicted.rate if v.predicted else 0,
                "measured": v.measured_rate,
                "mean_batch": [p.measured.stats.mean_batch for p in v.points if p.measured],
            }
            for v in verdicts
        },
    }
    if saturated and unbatched:
        figures["saturation"] = figures_saturation
    if recsys:
        same = tuned.at(single.predicted.rate) if single.predicted else None
        base = single.at(single.predicted.rate) if single.predicted else None
        if same and base and same.measured and base.measured:
            change = same.measured.p99_ms / base.measured.p99_ms - 1
            predicted_change = same.predicted.p99_ms / base.predicted.p99_ms - 1
            figures["p99_change_same_rate"] = {"predicted": predicted_change, "measured": change}
            lines += [
                "",
                f"p99 at the same rate ({single.predicted.rate:.0f}/s), tuned vs no batching: "
                f"predicted {100 * predicted_change:+.0f}%, measured {100 * change:+.0f}%.",
            ]
    figures["noise"] = outcome.noise
    again = outcome.noise.get("remeasured", [])
    lines += [
        "",
        f"Host noise (`perf.measure.noise`): {len(again)} of {outcome.noise.get('runs', 0)} runs "
        "measured again for the hypervisor's steal.",
    ]
    return lines, figures


def _percent(change: dict | None, key: str) -> str:
    return f"{100 * change[key]:+.0f}%" if change else "–"


def _times(gain: float | None) -> str:
    return "–" if gain is None or gain != gain else f"{gain:.2f}×"  # nan: nothing met the budget


def _summary(figures: dict[str, dict]) -> list[str]:
    """Every model's answer next to the article's (recsys)."""
    rows = [
        [
            model,
            _times(f["predicted_gain"]),
            _times(f["measured_gain"]),
            _times(f.get("saturation", {}).get("gain")),
            _percent(f.get("p99_change_same_rate"), "predicted"),
            _percent(f.get("p99_change_same_rate"), "measured"),
            f"{f['failed']}/{f['sent']}",
        ]
        for model, f in figures.items()
    ]
    rows.append(["the article", "–", "3.2×", "3.2×", "–", "−41%", "–"])
    header = [
        "model",
        "max rate in budget, pred",
        "max rate in budget, meas",
        "served at saturation",
        "p99 same rate, pred",
        "p99 same rate, meas",
        "failed/sent",
    ]
    return ["## Tuned batching vs no batching", "", table(header, rows), ""]


def write_scenario(
    scenario: str, folder: Path, budget: float, outcomes: list[ModelOutcome], engine: str
) -> Path:
    video = scenario == "video"
    unit = (
        (lambda rate: f"{rate / FPS:.0f} streams ({rate:.0f}/s)") if video else (lambda rate: f"{rate:.0f}/s")
    )
    lines = [
        f"# Scenario {scenario}: {', '.join(o.model for o in outcomes)}, p99 ≤ {budget:g} ms",
        "",
        f"Engine: {engine}. A pipeline's batching is its stages' (no batching: no stage batches; tuned: the "
        "first stage waits the delay, later stages re-form the batch); load goes through the ensemble.",
        "",
    ]
    figures = {}
    for outcome in outcomes:
        section, figures[outcome.model] = _section(outcome, unit, not video)
        lines += [*section, ""]
    if video:
        lines += ["The article: per-card QPS 15 → 58 (3.9×) with a 10 ms delay, latency under 15 ms."]
    else:
        lines += _summary(figures)
        lines += [
            "The article: 3.2× throughput, p99 −41%. Ids: Zipf (exponent 1.2) folded into each table's "
            f"range, {ZIPF_POOL_ROWS:,} distinct samples that each request takes the next of (our generator "
            "cycles through the pool; perf_analyzer through the same rows in its input-data file).",
        ]
    return write_report(folder / f"scenario_{scenario}.md", lines, figures)

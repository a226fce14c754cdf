"""``python -m perf tune … --witness model-analyzer``: Model Analyzer's brute search beside the tuner,
both picks (and the spec's configuration) measured with one yardstick.

After the tuner has picked (its own server stopped), Model Analyzer searches the same model for the
same budget over the same space (``perf.bench.model_analyzer``, its own server and venv, installed on
first use). Then one fresh server measures the three configurations with ``perf.bench.yardstick``,
rounds interleaved. ``run_witness`` returns what the saved result holds (``result.json``:
``model_analyzer``, a ``WitnessFigures``); ``perf.bench.versus_report`` renders the report's section
from it alone.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from exporters.schema.models import Spec
from perf.bench import model_analyzer
from perf.bench.versus_report import (
    OURS,
    SPEC,
    THEIRS,
    OursFigures,
    SearchFigures,
    WitnessFigures,
    YardstickFigures,
)
from perf.bench.yardstick import Plan, figures, measure_all
from perf.errors import OptionError
from perf.model.batcher import BatcherConfig
from perf.model_analyzer_install import VERSION, InstallError, ensure
from perf.session.model import ModelSession
from perf.session.search import FLOOR, on_ladder
from perf.tune.result import Seconds

SEARCH_TIMEOUT_S = 3 * 3600


def search_space(
    largest_batch: int, instances: tuple[int, ...], smoke: bool = False
) -> model_analyzer.SearchSpace:
    """Model Analyzer's space for the tuner's grid: its instance counts and batch sizes up to the
    largest the tuner serves."""
    return model_analyzer.SearchSpace(max(instances), largest_batch, smoke=smoke)


def run_witness(
    spec: Spec,
    model: str,
    budget_ms: float,
    rate: float,
    seconds: Seconds,
    chosen: BatcherConfig,
    space: model_analyzer.SearchSpace,
    session_factory: Callable[[], ModelSession],
    folder: Path,
    step: Callable[[str], None],
    rounds: int = 3,
    max_steps: int = 16,
    max_concurrency: int = 64,
) -> WitnessFigures:
    """Model Analyzer's search, then the yardstick on both picks and the spec's configuration; the
    figures the saved result keeps. ``budget_ms``, ``rate`` (where the yardstick's ramp starts from) and
    ``seconds`` are the tuner's result's."""
    try:
        program = ensure()
    except InstallError as error:
        raise OptionError(
            f"--witness model-analyzer: Model Analyzer could not be installed: {error}"
        ) from error
    base = spec.model(model)
    step(
        f"Model Analyzer {VERSION}: brute search of {model} for p99 ≤ {budget_ms:g} ms "
        "(its files: model-analyzer/)"
    )
    found = model_analyzer.search(
        program, base, budget_ms, space, folder / "model-analyzer", SEARCH_TIMEOUT_S
    )
    configs = {OURS: chosen, SPEC: model_analyzer.base_config(base)}
    if found.pick is not None:
        configs = {OURS: chosen, THEIRS: found.pick, SPEC: configs[SPEC]}
    start = on_ladder(max(rate, FLOOR))  # the search starts where the tuner measured its pick
    plan = Plan(budget_ms, start, rounds, max_steps=max_steps, max_concurrency=max_concurrency)
    with session_factory() as session:
        ramps = measure_all(session, configs, plan, step)
        engine = session.engine.name
    return WitnessFigures(
        version=VERSION,
        budget_ms=budget_ms,
        configs={name: config.label for name, config in configs.items()},
        search=SearchFigures(
            seconds=found.seconds,
            pick=found.pick.label if found.pick else None,
            pick_variant=found.pick_variant,
            pick_row=found.pick_row,
            variants=tuple(found.variants),
            profiled=tuple(found.profiled),
            rows=tuple(found.rows),
            config=str(found.config),
            smoke=space.smoke,
        ),
        ours=OursFigures(
            seconds=seconds.tuner if seconds.make_tune is None else seconds.make_tune,
            tuner_s=seconds.tuner,
        ),
        yardstick=YardstickFigures(engine, plan, figures(ramps, budget_ms)),
    )

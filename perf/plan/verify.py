"""The plan checked on the real server, where it can run (a CPU plan): the top architectures built,
served and measured at their predicted rate and below it, through the tuner's sessions
(``perf.tune.session.TuneSession`` for the whole model, ``perf.tune.pipeline_session`` for a split)
and its measurement layer: the same runs ``make tune`` makes, side by side with the predictions."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from exporters.spec import Spec
from perf.engine import LoadEngine, MeasureSettings
from perf.loads import poisson
from perf.model.batcher import BatcherConfig
from perf.plan.planner import Plan, Predictor
from perf.plan.profile import precision_variant, variants
from perf.plan.report import top_architectures
from perf.tune.pipeline_session import PipelineTuneSession
from perf.tune.session import TuneSession

log = logging.getLogger(__name__)
FRACTIONS = (0.7, 1.0)  # of the predicted highest rate within the budget


def verify(
    spec: Spec, model: str, plan: Plan, count: int, engine: LoadEngine, settings: MeasureSettings,
    workdir: Path, step: Callable[[str], None],
) -> list[dict[str, Any]]:  # fmt: skip
    """The ``count`` best architectures, each at ``FRACTIONS`` of its predicted rate: predicted and
    measured p99, the served rate, and whether the budget held."""
    rows = []
    base = spec.model(model)
    for index, judged in enumerate(top_architectures(plan, count)):
        s = judged.strategy
        folder = workdir / f"verify{index}"
        if s.kind == "data":
            variant = precision_variant(base, s.precision)
            session = TuneSession(
                Spec(models=(variant,)), variant.name, s.max_batch, folder, engine, settings
            )
            config = BatcherConfig(s.max_batch, s.delay_us, instances=s.instances[0])
        else:
            pipeline = dataclasses.replace(variants(spec, model).split[s.precision], replicas=s.instances)
            session = PipelineTuneSession(
                Spec(models=(base,), pipelines=(pipeline,)),
                pipeline.name,
                s.max_batch,
                folder,
                engine,
                settings,
            )
            config = BatcherConfig(base.max_batch_size, s.delay_us)
        assert judged.placement is not None
        predictor = Predictor(s, plan.profile, judged.placement, plan.request)
        step(f"verifying {s.label} on the real server")
        with session:
            session.prepare(config)
            for fraction in FRACTIONS:
                rate = fraction * judged.rate
                measured = session.measure(poisson(rate, plan.request.seed), f"plan {s.label} @ {rate:.0f}/s")
                predicted = predictor.at(rate)
                rows.append({
                    "strategy": s.label, "fraction": fraction, "rate": rate,
                    "predicted_p99_ms": predicted.p99_ms, "measured_p99_ms": measured.p99_ms,
                    "predicted_throughput": predicted.throughput, "measured_throughput": measured.throughput,
                    "met": measured.meets(plan.request.budget_ms),
                })  # fmt: skip
                log.info("%s", rows[-1])
    return rows

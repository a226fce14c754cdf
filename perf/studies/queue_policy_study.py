"""The queue-policy study: on Triton 2.51 a queue policy can leave requests waiting out the batcher's 500 ms
sleep unless spare instances wait (docs/SERVING.md, row 11); with and without, on 1 and SPARE_INSTANCES."""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

import tritonclient.http as httpclient

from exporters.configs.models import QUEUE_POLICY_SPARE_INSTANCES
from exporters.repository import build_repository
from exporters.schema.models import parse_spec
from perf.markdown import number, table
from perf.measure.engine import MeasureSettings
from perf.measure.loads import closed_loop
from perf.measure.measurement import Measurement
from perf.measure.records import latencies
from perf.studies.framework import StudyContext, StudyReport, write_report
from perf.studies.goals import GOALS, Goal, goals_table
from perf.studies.profiles import Profile
from perf.studies.study_spec import dynamic, family_entry

FAMILY = "recommender"
DELAY_US = 1_000
POLICY = {"max_queue_size": 256}
SPARE_INSTANCES = QUEUE_POLICY_SPARE_INSTANCES
STALL_MS = 400.0  # the batcher's sleep is 500 ms; nothing else here takes 400 ms


@dataclass(frozen=True)
class Variant:
    key: str
    title: str
    policy: bool
    instances: int

    @property
    def model(self) -> str:
        return f"{FAMILY}_queue_{self.key}"


VARIANTS = (
    Variant("none_x1", "no queue policy, 1 instance", False, 1),
    Variant("policy_x1", f"max_queue_size {POLICY['max_queue_size']}, 1 instance", True, 1),
    Variant("none_spare", f"no queue policy, {SPARE_INSTANCES} instances", False, SPARE_INSTANCES),
    Variant(
        "policy_spare", f"max_queue_size {POLICY['max_queue_size']}, {SPARE_INSTANCES} instances",
        True, SPARE_INSTANCES,
    ),
)  # fmt: skip
LOADS = ("closed", "open")


@dataclass(frozen=True)
class Point:
    """One configuration under one load: the client's figures over the measured span."""

    variant: str
    load: str
    sent: int
    failed: int
    throughput: float
    p50_ms: float
    p99_ms: float
    max_ms: float
    slow: int  # requests slower than STALL_MS

    @classmethod
    def of(cls, variant: Variant, load: str, measurement: Measurement) -> Point:
        summary = measurement.summary()
        ms = latencies(measurement.measured_records()) * 1e3
        return cls(
            variant.key, load, summary.requests, summary.failed, summary.throughput, summary.p50_ms,
            summary.p99_ms, float(ms.max()) if ms.size else float("nan"), int((ms > STALL_MS).sum()),
        )  # fmt: skip


def study_models(seed: int = 0) -> list[dict]:
    """The spec entries: one recommender graph, four ``config.pbtxt``s."""
    return [
        family_entry(FAMILY, v.model, dynamic(DELAY_US, POLICY if v.policy else None), v.instances, seed)
        for v in VARIANTS
    ]


class QueuePolicyStudy:
    name = "queue_policy"
    title = "queue policy: Triton 2.51's 500 ms wait and the spare-instance workaround"
    serves_spec = False

    def steps(self, profile: Profile) -> int:
        return 2 + len(VARIANTS) * len(LOADS) if profile.queue_policy_s else 0

    def run(self, context: StudyContext) -> StudyReport:
        profile = context.profile
        spec = parse_spec({"models": study_models(profile.seed)})
        # one span of queue_policy_s (three windows, all of them measured) after the profile's warm-up
        window_s = profile.queue_policy_s / 3
        span = MeasureSettings(profile.settings.warmup_s, window_s, stable_windows=3, max_windows=3)
        points: list[Point] = []
        context.workdir.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="queue-policy-", dir=context.workdir) as scratch:
            repository = Path(scratch) / "repository"
            context.progress("building the queue-policy study repository")
            build_repository(spec, repository, num_gpus=0)
            context.progress("starting tritonserver")
            with context.server(repository, "queue-policy-server.log") as server:
                served = served_configs(server.http_url)
                rate = 0.0  # the open loop's, once the closed loop has measured every capacity
                for load in LOADS:
                    for variant in VARIANTS:
                        target = context.target(server, spec.model(variant.model))
                        closed = load == "closed"
                        shape = closed_loop(profile.goal_concurrency) if closed else context.open_load(rate)
                        measured = context.measure(server, target, shape, settings=span)
                        points.append(Point.of(variant, load, measured))
                    rate = profile.poisson_fraction * capacity(points)
        goals = [stall_goal(points)]
        return write_report(context, self, report_lines(profile, points, rate, goals), goals, {
            "points": points, "open_loop_rate": rate, "stall_ms": STALL_MS, "seconds": profile.queue_policy_s,
            "served": served,
        })  # fmt: skip


def served_configs(http_url: str) -> dict[str, dict[str, int]]:
    """The queue bound (0: none) and instances each model serves with, read back from the server."""
    served = {}
    with httpclient.InferenceServerClient(http_url) as client:
        for variant in VARIANTS:
            config = client.get_model_config(variant.model)
            policy = config.get("dynamic_batching", {}).get("default_queue_policy", {})
            served[variant.model] = {
                "max_queue_size": int(policy.get("max_queue_size", 0)),
                "instances": sum(int(group["count"]) for group in config["instance_group"]),
            }
    return served


def capacity(points: list[Point]) -> float:
    """The lower closed-loop throughput without the policy: the open loop must overload none."""
    with_policy = {v.key for v in VARIANTS if v.policy}
    return min(p.throughput for p in points if p.load == "closed" and p.variant not in with_policy)


def _closed(points: list[Point], variant: str) -> float:
    return next(p.throughput for p in points if p.variant == variant and p.load == "closed")


def _slow(points: list[Point], variant: str) -> int:
    return sum(p.slow for p in points if p.variant == variant)


def stall_goal(points: list[Point]) -> Goal:
    """Slow requests the policy adds on the spare-instance model, both loads together."""
    spec = GOALS["queue policy with spare instances"]
    added = _slow(points, "policy_spare") - _slow(points, "none_spare")
    policy_x1 = _slow(points, "policy_x1")
    return spec.outcome(
        f"{added:+d} (1 instance with the policy: {policy_x1} slow)", spec.met(added),
        "" if spec.met(added) else "a spare instance was not waiting when the last arrivals came",
        stall=f"{STALL_MS:g}", instances=SPARE_INSTANCES,
    )  # fmt: skip


def report_lines(profile: Profile, points: list[Point], rate: float, goals: list[Goal]) -> list[str]:
    titles = {v.key: v.title for v in VARIANTS}
    loads = {"closed": "closed loop", "open": f"Poisson {rate:.0f}/s"}
    rows = [
        [titles[p.variant], loads[p.load], p.sent, p.failed, number(p.throughput, 0), number(p.p50_ms),
         number(p.p99_ms), number(p.max_ms), p.slow]
        for p in points
    ]  # fmt: skip
    header = ["configuration", "load", "sent", "failed", "inf/s", "p50 ms", "p99 ms", "max ms",
              f"> {STALL_MS:g} ms"]  # fmt: skip
    slow_x1 = _slow(points, "policy_x1")
    return [
        "# Queue policy: Triton 2.51's 500 ms wait and the spare-instance workaround",
        "",
        f"The recommender (dynamic batching, {DELAY_US // 1000} ms) four ways, each measured for "
        f"{profile.queue_policy_s:g} s per load over {profile.protocol}: a closed loop at concurrency "
        f"{profile.goal_concurrency} (back to back) and Poisson arrivals at {profile.poisson_fraction:g}× "
        "the lower capacity of the two without the policy (the same arrivals for every configuration). "
        "Figures from the client's records.",
        "",
        table(header, rows),
        "",
        f"With the policy and one instance, {slow_x1} request(s) took over {STALL_MS:g} ms: any queue policy "
        "turns off payload prefetching in Triton 2.51, so only an arrival that finds an instance waiting "
        "wakes the batcher, and requests that arrived while every instance was busy wait out its fixed "
        f"500 ms sleep. With {SPARE_INSTANCES} instances one is almost always waiting. The workaround's "
        f"price here: closed-loop throughput {_closed(points, 'policy_spare'):,.0f} inf/s with the policy "
        f"and {SPARE_INSTANCES} instances against {_closed(points, 'none_x1'):,.0f} inf/s for one instance "
        f"without it ({SPARE_INSTANCES} sessions share this machine's cores). On a release without the "
        "wait, the policy rows match the rows without it.",
        "",
        goals_table(goals),
    ]

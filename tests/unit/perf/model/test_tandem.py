"""The tandem of batchers and the link table against cases computed by hand (times in ms)."""

from __future__ import annotations

import pytest

from perf.errors import OptionError
from perf.model import tandem
from perf.model.batcher import BatcherConfig, ServiceModel, SimResult, simulate
from perf.model.links import HOST, Link, Transfer, link_for
from perf.model.tandem import TandemStage, simulate_tandem, tandem_bound


def ms(values) -> list[float]:
    return [round(float(v) * 1e3, 6) for v in values]


def stage(t_ms: float, dt_ms: float = 0.0, max_batch: int = 1, instances: int = 1) -> TandemStage:
    return TandemStage(
        BatcherConfig(max_batch, 0, instances=instances), ServiceModel(t_ms / 1e3, dt_ms / 1e3)
    )


@pytest.fixture
def stage_batches(monkeypatch: pytest.MonkeyPatch) -> list[list[int]]:
    """Each stage's formed batch sizes, in stage order, as the tandem's batcher runs return them."""
    formed: list[list[int]] = []

    def recorded(*args, **kwargs) -> SimResult:
        result = simulate(*args, **kwargs)
        formed.append(result.batch_sizes.tolist())
        return result

    monkeypatch.setattr(tandem, "simulate", recorded)
    return formed


@pytest.fixture
def link_sends(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The seconds of each transfer a link carried."""
    sent: list[float] = []
    seconds = Transfer.seconds

    def recorded(self: Transfer, batch: int) -> float:
        sent.append(seconds(self, batch))
        return sent[-1]

    monkeypatch.setattr(Transfer, "seconds", recorded)
    return sent


def test_a_request_crosses_both_stages_and_the_link_between_them() -> None:
    # stage 0: 10; link: 5 µs + 1000 B at 1 GB/s (1 µs); stage 1: 4 → 14.006
    link = Link("PIX", 1.0, 5.0)
    result = simulate_tandem([0.0], [stage(10), stage(4)], [Transfer(1000, link)])
    assert ms(result.latencies_s) == [14.006]


def test_a_link_sends_one_batch_at_a_time(link_sends: list[float]) -> None:
    # two requests at 0 finish stage 0 together at 10 (two instances); each crossing takes 1 (1 MB at
    # 1 GB/s, no hop latency): they reach stage 1 at 11 and 12; stage 1 (5, one instance) ends at 16, 21
    link = Link("PIX", 1.0, 0.0)
    result = simulate_tandem([0.0, 0.0], [stage(10, instances=2), stage(5)], [Transfer(1e6, link)])
    assert ms(result.latencies_s) == [16, 21]
    assert sum(link_sends) / result.span_s == pytest.approx(2 / 21)  # the share of the span it was sending


def test_a_batch_crosses_together_and_is_formed_again_downstream_with_overhead_once(
    stage_batches: list[list[int]],
) -> None:
    # three at 0: stage 0 runs them as one batch (2 + 2·1 = 4), the host link costs nothing, stage 1 forms
    # the three again (1) → 5, plus 1 of overhead once → 6 each
    stages = [stage(2, 1, max_batch=4), stage(1, 0, max_batch=4)]
    result = simulate_tandem([0.0, 0.0, 0.0], stages, [Transfer(4096, HOST)], overhead_s=0.001)
    assert ms(result.latencies_s) == [6, 6, 6]
    assert stage_batches == [[3], [3]] and result.batch_sizes.tolist() == [3]


def test_requests_reach_the_next_stage_in_the_order_they_finished(stage_batches: list[list[int]]) -> None:
    # A, B at 0 form a batch of 2 (10 + 10 = 20); C at 1 takes the second instance alone (10, done 11).
    # Stage 1 (1 per batch) runs C at 11..12, then A and B together at 20..21.
    stages = [stage(10, 10, max_batch=2, instances=2), stage(1, 0, max_batch=4)]
    result = simulate_tandem([0.0, 0.0, 0.001], stages, [Transfer(0, HOST)])
    assert ms(result.latencies_s) == [21, 21, 11]
    assert stage_batches[1] == [1, 2]


def test_the_bound_is_the_slowest_stage_or_link() -> None:
    # stage 0: 2 instances × 4 / 8 ms = 1000/s; stage 1: 4 / 2 ms = 2000/s; link: 4 / (1 ms + 4 × 1 ms)
    slow_link = Transfer(1e6, Link("SYS", 1.0, 1000.0))
    stages = [stage(5, 1, max_batch=4, instances=2), stage(2, 0, max_batch=4)]
    assert tandem_bound(stages, [Transfer(0, HOST)]) == pytest.approx(1000)
    assert tandem_bound(stages, [slow_link]) == pytest.approx(800)


def test_a_tandem_needs_one_transfer_per_boundary() -> None:
    with pytest.raises(OptionError, match="2 stages need 1 transfers"):
        simulate_tandem([0.0], [stage(1), stage(1)], [])


@pytest.mark.parametrize(
    ("level", "gpu", "gbs", "latency_us"),
    [
        ("NV12", "NVIDIA A100-SXM4-80GB", 300.0, 5.0),  # 12 × 25 GB/s per direction
        ("NV18", "NVIDIA H200", 450.0, 5.0),
        ("NV2", "Tesla V100-SXM2-32GB", 50.0, 5.0),
        ("NV1", "Tesla V100-SXM2-32GB", 25.0, 5.0),
        ("SYS", "Tesla V100-SXM2-32GB", 15.75 / 2, 20.0),  # through host memory: half of PCIe Gen3
        ("PIX", "NVIDIA L4", 31.5, 8.0),
        ("PHB", "NVIDIA L4", 31.5, 10.0),
    ],
)
def test_the_link_table_per_level_and_generation(level: str, gpu: str, gbs: float, latency_us: float) -> None:
    link = link_for(level, gpu)
    assert (link.gbs, link.latency_us) == (gbs, latency_us)
    # a batch of 32 of 1 KiB samples: the hop latency plus 32 KiB over the bandwidth
    assert Transfer(1024, link).seconds(32) == pytest.approx(latency_us * 1e-6 + 32 * 1024 / (gbs * 1e9))


def test_an_unknown_level_is_refused_by_name() -> None:
    with pytest.raises(OptionError, match="unknown link level 'XYZ'"):
        link_for("XYZ", "NVIDIA L4")

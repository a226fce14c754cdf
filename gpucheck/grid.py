"""What the check measures and for how long: fixed short windows rather than until stable, and a
``deadline_s`` that leaves time to write the report (the sections run most important first)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Grid:
    name: str
    latency_models: tuple[tuple[str, str], ...]  # (models.yaml entry, precision): the latency model's
    pipelines: tuple[str, ...]  # the spec's pipelines of the image classifier to serve
    batches: tuple[int, ...]  # the latency model's batch sizes (the largest is every model's max_batch_size)
    concurrencies: tuple[int, ...]  # dynamic batching vs none
    instances: tuple[int, ...]  # instance_group counts on GPU 0
    instance_concurrency: int
    pipeline_batches: tuple[int, ...]  # the pipeline study's request sizes (latency, one in flight)
    pipeline_concurrency: int  # and its throughput point
    shm_requests: int  # per transport, after a warm-up
    shm_mib: int  # the payload of the shared-memory study: one input of this many MiB
    requests_per_batch: int  # served latency: requests timed at each batch size
    raw_repeats: int  # raw torch: timed runs at each batch size (median)
    raw_warmup: int  # raw torch: untimed runs before them
    window_s: float  # throughput points: measured window (after warmup_s)
    warmup_s: float
    deadline_s: float  # stop starting sections after this many seconds; the report is written anyway

    @property
    def max_batch(self) -> int:
        return max(self.batches)


GPU = Grid(
    name="gpu",
    latency_models=(
        ("recommender", "fp32"),
        ("recommender", "fp16"),
        ("image_classifier", "fp32"),
        ("image_classifier", "fp16"),
    ),
    pipelines=("image_classifier_pipeline", "image_classifier_pipeline_fp16"),
    batches=(1, 2, 4, 8, 16, 32, 64, 128, 256),
    concurrencies=(1, 16, 64),
    instances=(1, 2, 4),
    instance_concurrency=64,
    pipeline_batches=(1, 32),
    pipeline_concurrency=16,
    shm_requests=200,
    shm_mib=1,
    requests_per_batch=30,
    raw_repeats=50,
    raw_warmup=5,
    window_s=4.0,
    warmup_s=1.0,
    deadline_s=390.0,
)

# Every code path of the GPU grid with fewer stubs (each imports torch: a 2-core machine's minutes); fp16
# only through the recommender (fp16 convolutions are slow on a CPU), one pipeline.
REHEARSAL = Grid(
    name="rehearsal",
    latency_models=(("recommender", "fp32"), ("recommender", "fp16"), ("image_classifier", "fp32")),
    pipelines=("image_classifier_pipeline_fp16",),
    batches=(1, 2, 4, 8),
    concurrencies=(1, 4),
    instances=(1, 2),
    instance_concurrency=4,
    pipeline_batches=(1, 4),
    pipeline_concurrency=2,
    shm_requests=10,
    shm_mib=1,
    requests_per_batch=4,
    raw_repeats=3,
    raw_warmup=1,
    window_s=1.0,
    warmup_s=0.5,
    deadline_s=900.0,
)

GRIDS = {grid.name: grid for grid in (GPU, REHEARSAL)}

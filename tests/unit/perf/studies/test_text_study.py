"""The text-embedding study's arithmetic without a server: corpus, row cycling, token counters, goals."""

from __future__ import annotations

import numpy as np
import pytest

from client.text_reference import text_array
from perf.errors import OptionError
from perf.measure.records import Record, summarize
from perf.measure.target import Caller, Target
from perf.studies.profiles import get_profile
from perf.studies.text_study import Point, TextResult, goals, make_corpus, padding_waste, token_counters

METRICS = """# HELP text_tokens_total tokens handed to the encoder
text_tokens_total{kind="real",model="text_buckets_tokenizer"} 1000
text_tokens_total{kind="padded",model="text_buckets_tokenizer"} 1500
text_tokens_total{kind="real",model="text_longest_tokenizer"} 400
ragged_batch_elements_total{kind="computed",model="text_longest_encoder"} 1800
nv_inference_count{model="text_buckets",version="1"} 12
"""


def test_corpus_is_deterministic_with_a_realistic_length_mix() -> None:
    corpus = make_corpus(512, seed=0)
    assert corpus == make_corpus(512, seed=0) and corpus != make_corpus(512, seed=1)
    kinds = [c.kind for c in corpus]
    assert 0.5 < kinds.count("query") / 512 < 0.7 and 0.08 < kinds.count("passage") / 512 < 0.22
    words = {kind: [len(c.text.split()) for c in corpus if c.kind == kind] for kind in set(kinds)}
    assert max(words["query"]) <= 10 and min(words["passage"]) >= 90


def test_a_cycling_target_sends_every_row_in_turn() -> None:
    pool = text_array([c.text for c in make_corpus(5, seed=0)])
    caller = Caller(Target("m", "url", {"text": pool}, {"embedding": 1536}, cycle=True), t0=0.0)
    caller.module = __import__("tritonclient.grpc", fromlist=["InferInput"])
    sent = [caller._request_inputs(2)[0][0]._raw_content for _ in range(3)]
    assert len({bytes(s) for s in sent}) == 3  # rows 0-1, 2-3, 4-0: three different requests
    with pytest.raises(OptionError, match="no --shm"):
        Target("m", "url", {"text": pool}, {"embedding": 1536}, cycle=True, shared_memory=True)


def test_token_counters_and_padding_waste() -> None:
    before = token_counters(METRICS, "text_buckets_tokenizer")
    assert before == {"text_tokens_total:real": 1000.0, "text_tokens_total:padded": 1500.0}
    after = {"text_tokens_total:real": 1200.0, "text_tokens_total:padded": 1800.0}
    assert padding_waste(before, after) == pytest.approx(1.5)
    ragged = token_counters(METRICS, "text_longest_tokenizer") | token_counters(
        METRICS, "text_longest_encoder"
    )
    assert padding_waste({}, ragged) == pytest.approx(4.5)  # the encoder's padding per formed batch counts
    assert np.isnan(padding_waste({}, {}))


def _point(mode: str, load: str, rate: float, p99_ms: float, formed: dict[int, int]) -> Point:
    records = [Record("m", i / rate, i / rate + p99_ms / 1000, 1, 0, 0, True) for i in range(int(rate))]
    return Point(mode, load, summarize(records, 0.0, 1.0), len(records), 0, formed, 1.2)


def test_goals_are_ratios_within_the_run() -> None:
    result = TextResult(get_profile("quick"))
    result.points = [
        _point("buckets", "closed mixed", 80, 50, {4: 10}),
        _point("none", "closed queries", 100, 20, {1: 100}),
        _point("buckets", "closed queries", 200, 20, {8: 25}),
        _point("buckets", "queries alone", 20, 10, {}),
        _point("buckets", "queries shared", 20, 40, {}),
    ]
    result.raw = {"buckets, batch 4": [4, 90.0, 1.3]}
    served, dynamic, shared, _ = goals(result)
    assert served.met is True and "at batch 4" in served.measured  # 80/90 ≥ 0.8
    assert dynamic.met is True and dynamic.measured.startswith("2.00×")
    assert shared.met is False and shared.measured.startswith("4.00×")
    result.raw = {}
    assert goals(result)[0].met is None  # no raw reference at the served batch: not measured


def test_int8_vs_fp32_is_a_reported_goal_at_the_served_fp32_batch() -> None:
    result = TextResult(get_profile("quick"))
    result.points = [
        _point("buckets", "closed mixed", 80, 50, {4: 10}),
        _point("int8", "closed mixed", 100, 40, {4: 10}),
    ]
    result.raw = {"buckets, batch 4": [4, 90.0, 1.3], "int8 buckets, batch 4": [4, 180.0, 1.3]}
    int8 = goals(result)[-1]
    assert int8.name == "text int8 vs fp32" and int8.target.startswith("int8 encoder ≥ 1.8×")
    assert int8.met is True and int8.measured.startswith("2.00× raw (180.0 vs 90.0 sentences/s at batch 4)")
    assert "; served 1.2" in int8.measured  # the served pair beside it (about 100 vs 80 over the window)
    result.raw["int8 buckets, batch 4"] = [4, 120.0, 1.3]
    assert goals(result)[-1].met is False  # 1.33×: reported as missed, the run still passes
    del result.raw["int8 buckets, batch 4"]
    assert goals(result)[-1].met is None and goals(result)[-1].measured == "not measured"
    no_int8 = TextResult(get_profile("quick", text_int8=False))
    assert [g.name for g in goals(no_int8)][-1] != "text int8 vs fp32"


def test_profiles_check_text_modes() -> None:
    assert get_profile("smoke").text_modes == ()
    with pytest.raises(OptionError, match="unknown text modes: sorted"):
        get_profile("quick", text_modes=("sorted",))

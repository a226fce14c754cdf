"""Load shapes: seeded Poisson arrivals repeat exactly and have the asked-for rate; traces replay."""

import itertools

import numpy as np
import pytest

from perf.measure.loads import closed_loop, poisson, read_trace, trace


def take(load, count):
    return np.fromiter(itertools.islice(load.arrivals(), count), dtype=float)


def test_poisson_is_reproducible_per_seed_and_differs_across_seeds():
    first, again, other = (
        take(poisson(500, seed=3), 1000),
        take(poisson(500, seed=3), 1000),
        take(poisson(500, seed=4), 1000),
    )
    np.testing.assert_array_equal(first, again)
    assert not np.array_equal(first, other)


def test_poisson_rate_and_exponential_gaps():
    arrivals = take(poisson(200, seed=0), 20_000)
    gaps = np.diff(arrivals)
    assert np.all(gaps >= 0)
    assert arrivals.size / arrivals[-1] == pytest.approx(200, rel=0.03)
    # Exponential: the coefficient of variation is 1 (a fixed-rate generator would give 0).
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, rel=0.05)


def test_trace_replays_gaps_cyclically(tmp_path):
    load = trace([0.1, 0.3])
    np.testing.assert_allclose(take(load, 5), [0.1, 0.4, 0.5, 0.8, 0.9])
    assert load.rate == pytest.approx(5.0)
    path = tmp_path / "gaps.txt"
    path.write_text("# seconds\n0.2\n0.2 # steady\n")
    np.testing.assert_allclose(take(read_trace(str(path)), 3), [0.2, 0.4, 0.6])


@pytest.mark.parametrize(
    "bad", [lambda: closed_loop(0), lambda: poisson(0), lambda: trace([]), lambda: trace([-1, 2])]
)
def test_invalid_loads_are_rejected(bad):
    with pytest.raises(ValueError):
        bad()


def test_a_poisson_loads_name_keeps_a_low_rates_digits():
    """A search on a loaded host goes below 1 request/s; its runs must not all be named "0/s"."""
    assert [poisson(rate).name for rate in (0.4, 2.5, 9.99, 10, 1600.4)] == [
        "Poisson 0.4/s",
        "Poisson 2.5/s",
        "Poisson 10.0/s",
        "Poisson 10/s",
        "Poisson 1,600/s",
    ]

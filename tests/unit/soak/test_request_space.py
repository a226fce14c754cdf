"""The request space of the invariant fuzz without a server (tests/faults/test_invariant_fuzz.py sends
it to the real one): a model's space read from its served config, every drawn case printed as it
replays, and the strategies' notion of a valid request the fronts' own."""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import seed as hypothesis_seed

from server.fronts.refusal import RequestRefusedError
from soak.fuzz_wire import carried
from soak.request_space import Case, cases
from tests.unit.soak.fuzz_spaces import SPACES, allowed, replayed


def test_a_model_space_is_read_from_the_served_config() -> None:
    encoder = SPACES[0]
    assert encoder.max_batch_size == 32 and encoder.deadline_s == 60.0
    ids, mask = encoder.inputs
    assert (ids.datatype, ids.dims, ids.bounds, ids.value_range) == ("INT64", (-1,), ((1, 16),), (0, 30522))
    assert mask.value_range == (0, 2)
    assert encoder.variable_axes() == {0: (1, 16)}
    assert [o.name for o in encoder.outputs] == ["embedding"]


@settings(max_examples=300, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@hypothesis_seed(0)
@given(cases(SPACES))
def test_every_drawn_case_prints_as_it_replays(case: Case) -> None:
    """A failing case is replayed from what hypothesis prints (``INVARIANT_FUZZ_CASE``): its repr is the
    case, and its data come from its seed alone."""
    assert replayed(repr(case)) == case
    rules = {rule.name: rule for space in SPACES for rule in space.inputs}
    first = [carried(t, rules.get(t.name), case.seed + i).raw for i, t in enumerate(case.inputs)]
    again = [carried(t, rules.get(t.name), case.seed + i).raw for i, t in enumerate(case.inputs)]
    assert first == again


@settings(max_examples=100, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@hypothesis_seed(0)
@given(cases(SPACES))
def test_a_case_inside_every_bound_is_one_the_allow_list_accepts(case: Case) -> None:
    """The strategies' own notion of a valid request is the fronts' (so the fuzz reaches the models):
    a case without faults whose dims all sit inside their bounds passes ``check_allowed``. Hypothesis
    must find enough such cases among its draws (``assume``; else its health check fails the test)."""
    space = next((s for s in SPACES if s.name == case.model), None)
    assume(space is not None and sorted(t.name for t in case.inputs) == sorted(r.name for r in space.inputs))
    assert space is not None
    for tensor in case.inputs:
        rule = next(r for r in space.inputs if r.name == tensor.name)
        assume(
            tensor.datatype == rule.datatype
            and len(tensor.shape) == len(rule.dims) + 1
            and 1 <= tensor.shape[0] <= space.max_batch_size
            and all(low <= d <= high for d, (low, high) in zip(tensor.shape[1:], rule.bounds, strict=True))
            and tensor.elements == math.prod(tensor.shape)
            and tensor.byte_delta == 0
            and not tensor.bytes_fault
        )
    try:
        allowed(space, case.inputs, case.seed)
    except RequestRefusedError as refusal:
        pytest.fail(f"{case} refused: {refusal}")

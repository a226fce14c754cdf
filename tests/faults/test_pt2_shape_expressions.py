"""Fault matrix row 47: no string from a ``.pt2`` archive reaches ``sympify`` or a sympy constructor.

torch's loader runs every shape expression (``expr_str``) through ``sympy.sympify``; many sympy classes
then evaluate their own string arguments as Python. The fuzz puts each name sympy exports (and each of
torch's sympy functions) into a program's first shape expression, called with a string that would
``touch`` a marker, alone and nested in a valid expression, and loads it through the loader every path
uses (``exporters build``, ``exporters init --torch-export`` and the stage runner; ``test_pt2_allow_list``
drives those three with one such archive). Each must be refused naming the expression, and no marker
may appear. Seeded random expressions of the grammar torch writes must parse to exactly what torch's
own ``sympify`` call makes of them, and programs with composite shapes must still load and run.
"""

from __future__ import annotations

import io
import logging
import random
import re
from pathlib import Path

import pytest
import sympy
import torch
from crafted_programs import linear_program, with_expression, with_program_text
from torch import nn

from python_backend.torch_stage.safe_program import UnsafeArtifactError, load_exported_program
from python_backend.torch_stage.shape_expressions import (
    ARITY,
    FUNCTIONS,
    TORCH_FUNCTIONS,
    ShapeExpressionError,
    parse_shape_expression,
)

pytestmark = pytest.mark.integration

NAMES = sorted({n for n in dir(sympy) if not n.startswith("_")} | set(TORCH_FUNCTIONS) | {"S", "Symbol"})
TEMPLATES = (
    "{name}({payload!r})",
    "Add(Symbol('s0', integer=True), {name}({payload!r}))",
    "Symbol('s0', integer=True, {name}={payload!r})",
)
ODD = ("{payload}", "Symbol({payload!r})", "Integer({payload!r})", "Float({payload!r}, precision=53)",
       "Symbol('s0', integer=True)\n+{payload}", "lambda: {payload}", "Symbol('s0')[0]",
       "Mul(Integer(2), Symbol('s0', integer=True)).func({payload!r})")  # fmt: skip


def test_no_string_in_a_shape_expression_reaches_sympy(tmp_path: Path) -> None:
    logging.getLogger("torch").setLevel(logging.ERROR)
    base = linear_program(tmp_path / "valid.pt2")
    marker = tmp_path / "pwned"
    payload = f"__import__('os').system('touch {marker}')"
    expressions = [t.format(name=n, payload=payload) for n in NAMES for t in TEMPLATES]
    expressions += [odd.format(payload=payload) for odd in ODD]
    accepted = []
    for expression in expressions:
        target = with_expression(base, tmp_path / "crafted.pt2", expression)
        try:
            load_exported_program(target)
            accepted.append(expression)
        except UnsafeArtifactError as error:
            assert "which is not a plain shape expression" in str(error), (expression, error)
        except Exception:  # refused by torch itself: the marker check below still holds
            accepted.append(expression)
        assert not marker.exists(), f"the archive's code ran: {expression}"
    assert accepted == [], accepted[:5]
    assert len(expressions) > 1000


def test_a_hint_that_is_not_a_number_is_refused(tmp_path: Path) -> None:
    """The loader hands a shape's ``hint`` to sympy as well: only one number is let through."""
    base = linear_program(tmp_path / "valid.pt2")
    hint = re.compile(r'"hint": \{"as_int": (\d+)\}')
    target = with_program_text(
        base, tmp_path / "crafted.pt2", lambda text: hint.sub(r'"hint": {"as_int": "\1"}', text, 1)
    )
    with pytest.raises(UnsafeArtifactError, match="is not one number"):
        load_exported_program(target)


def _random_expression(chooser: random.Random, depth: int) -> sympy.Basic:
    """A random integer shape expression built by sympy itself (what ``torch.export.save`` prints)."""
    if depth == 0 or chooser.random() < 0.3:
        if chooser.random() < 0.5:
            return sympy.Integer(chooser.randint(-(2**16), 2**16))
        assumptions = chooser.choice(({"integer": True}, {"integer": True, "positive": True}, {}))
        return sympy.Symbol(f"{chooser.choice(('s', 'u', 'ps'))}{chooser.randint(0, 99)}", **assumptions)
    integer_functions = ("Add", "Mul", "Max", "Min", "FloorDiv", "Mod", "PythonMod", "CleanDiv", "CeilDiv")
    name = chooser.choice(integer_functions)
    least, most = ARITY[name]
    arguments = [_random_expression(chooser, depth - 1) for _ in range(chooser.randint(least, min(most, 4)))]
    try:
        return FUNCTIONS[name](*arguments)
    except (ArithmeticError, ValueError, TypeError, AssertionError):  # arguments the function refuses
        return arguments[0]


@pytest.mark.parametrize("seed", range(4))
def test_random_valid_expressions_parse_as_torch_reads_them(seed: int) -> None:
    """Each printed expression parses, to the very object torch's ``sympify`` call makes of it (the
    same locals its deserializer passes), and prints back to the same string."""
    chooser = random.Random(seed)
    torch_locals = {name: getattr(torch.utils._sympy.functions, name) for name in TORCH_FUNCTIONS}
    for _ in range(150):
        expression = _random_expression(chooser, chooser.randint(0, 5))
        text = sympy.srepr(expression)
        parsed = parse_shape_expression(text)
        assert parsed == sympy.sympify(text, locals=torch_locals) == expression, text
        assert sympy.srepr(parsed) == text


def _symbols(first: int, last: int) -> str:
    return ", ".join(f"Symbol('s{i}', integer=True)" for i in range(first, last))


SEVENTEEN = _symbols(0, 17)
TINY_POWER = f"Pow(Mul(Rational(1, {2**128 - 1}), Symbol('s0', integer=True)), Integer(128))"


@pytest.mark.parametrize(
    "text",
    ["Tuple('s0')", "Symbol('s0', integer=True, integer=True)", "Add(Integer(1))", "Integer(1.5)",
     "Pow(Integer(2), Integer(1000000))", "Symbol('S0')", "Integer(٣)", "Symbol('s0') ", "true()",
     f"Max({SEVENTEEN})", f"Min(Min({_symbols(0, 9)}), Min({_symbols(9, 18)}))",
     f"Pow(Pow({TINY_POWER}, Integer(128)), Integer(128))", f"Integer({2**128 + 1})"],
)  # fmt: skip
def test_strings_outside_the_grammar_are_refused(text: str) -> None:
    """Among them, strings whose evaluation would take minutes (a Max of many arguments, numbers
    raised again and again): the check refuses them before building them."""
    if text.endswith(" "):  # trailing spaces are whitespace between tokens: allowed
        assert parse_shape_expression(text) == sympy.Symbol("s0")
        return
    with pytest.raises(ShapeExpressionError):
        parse_shape_expression(text)


class CompositeShapes(nn.Module):
    """Shapes whose expressions use ``Mul``, ``Add``, ``Max``, ``Mod`` and ``FloorDiv``."""

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        pairs = x.reshape(-1, 2).sum()
        both = torch.cat([x, y], 0)
        return pairs + both[: x.shape[0] // 2].sum() + x.shape[0] % 3 + max(x.shape[0], y.shape[0])


def test_programs_with_composite_shapes_load_and_run(tmp_path: Path) -> None:
    half, other = torch.export.Dim("half", min=2, max=64), torch.export.Dim("other", min=1, max=64)
    inputs = (torch.randn(4, 3), torch.randn(6, 3))
    program = torch.export.export(CompositeShapes(), inputs, dynamic_shapes=({0: 2 * half}, {0: other}))
    buffer = io.BytesIO()
    torch.export.save(program, buffer)
    path = tmp_path / "composite.pt2"
    path.write_bytes(buffer.getvalue())
    loaded = load_exported_program(path).module()
    for rows, more in ((4, 6), (10, 3), (128, 64)):
        x, y = torch.randn(rows, 3), torch.randn(more, 3)
        torch.testing.assert_close(loaded(x, y), CompositeShapes()(x, y))

"""A program's shape expressions, parsed by an explicit grammar before torch's loader evaluates them.

``torch.export.load`` hands every ``expr_str`` in ``models/model.json`` to ``sympy.sympify``, which
runs the string as Python with all of sympy in scope; many sympy constructors then parse their own
string arguments as Python again (``Tuple("__import__('os')...")``). So no string from the archive may
reach a constructor we do not control: ``parse_shape_expression`` reads the string with its own small
recursive-descent parser over the exact grammar ``torch.export.save`` writes (``sympy.srepr`` of an
integer shape expression), builds the sympy object itself from Python ints and ``Symbol`` names, and
refuses anything else. What ``sympify`` then runs on an accepted string is the same calls with the same
arguments: constructors of the classes below, each given only sympy objects built the same way.

Grammar (spaces between tokens are ignored)::

    expression := "true" | "false" | call
    call       := "Integer(" int ")" | "Rational(" int "," int ")" | symbol | function
    symbol     := "Symbol(" name ("," assumption "=" ("True" | "False"))* ")"
    function   := FUNCTION "(" expression ("," expression)* ")"      (ARITY: arguments per FUNCTION)
    int        := "-"? digits (at most 39)        name := "'" [a-z]{1,3} digits "'"

Standard library, sympy and torch only: copied beside each stage's model.py.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import sympy
import torch.utils._sympy.functions as torch_sympy

MAX_LENGTH = 20_000  # characters in one expression: torch writes a few hundred at most
MAX_DEPTH = 64  # nesting of calls

# Names ``sympify`` resolves from the locals torch's deserializer passes (its own sympy functions).
TORCH_FUNCTIONS = ("FloorDiv", "ModularIndexing", "Where", "PythonMod", "Mod", "CleanDiv", "CeilToInt",
                   "FloorToInt", "CeilDiv", "LShift", "RShift", "PowByNatural", "FloatPow", "FloatTrueDiv",
                   "IntTrueDiv", "IsNonOverlappingAndDenseIndicator", "TruncToFloat", "TruncToInt",
                   "RoundToInt", "RoundDecimal", "ToFloat", "Identity")  # fmt: skip
UNARY = ("Not", "Abs", "floor", "ceiling", "CeilToInt", "FloorToInt", "TruncToFloat", "TruncToInt",
         "RoundToInt", "ToFloat", "Identity")  # fmt: skip
BINARY = ("Pow", "Mod", "FloorDiv", "CeilDiv", "CleanDiv", "PythonMod", "PowByNatural", "FloatPow",
          "FloatTrueDiv", "IntTrueDiv", "LShift", "RShift", "RoundDecimal", "Equality", "Unequality",
          "StrictLessThan", "StrictGreaterThan", "LessThan", "GreaterThan")  # fmt: skip
# (least, most) arguments, a nested Max's or Min's counted as its own (sympy flattens them); each
# argument a sympy expression.
ARITY: dict[str, tuple[int, int]] = {
    **dict.fromkeys(("Add", "Mul", "And", "Or", "IsNonOverlappingAndDenseIndicator"), (2, 256)),
    **dict.fromkeys(("Max", "Min"), (2, 16)),  # sympy compares their arguments pairwise, slowly
    **dict.fromkeys(("ModularIndexing", "Where"), (3, 3)),
    **dict.fromkeys(UNARY, (1, 1)),
    **dict.fromkeys(BINARY, (2, 2)),
}
FLATTENED = frozenset(("Add", "Mul", "Max", "Min", "And", "Or"))  # sympy merges a nested call into its own
FUNCTIONS: dict[str, Callable[..., sympy.Basic]] = {
    name: getattr(torch_sympy if name in TORCH_FUNCTIONS else sympy, name) for name in ARITY
}
ASSUMPTIONS = frozenset(("integer", "positive", "nonnegative", "negative", "nonpositive", "real",
                         "finite", "zero", "nonzero", "rational", "even", "odd", "commutative"))  # fmt: skip
CONSTANTS = {"true": sympy.true, "false": sympy.false}
TOKEN = re.compile(
    r" *(?:(?P<name>[A-Za-z]\w*)|(?P<int>-?\d{1,39})|'(?P<symbol>[a-z]{1,3}\d{1,9})'|(?P<punct>[(),=]))",
    re.ASCII,
)
# Numbers stay small enough to compute at once: a power's exponent, and every number a power makes
# (its value, or a coefficient it raises: only powers grow numbers faster than the text grows).
POWERS = frozenset(("Pow", "PowByNatural", "FloatPow", "LShift"))
MAX_EXPONENT = 128
MAX_NUMBER = 2**128


def _small(number: sympy.Number) -> bool:
    """Whether ``number`` (its numerator and denominator, if rational) lies within ``MAX_NUMBER``."""
    if number.is_Rational:
        return abs(number.p) <= MAX_NUMBER and number.q <= MAX_NUMBER
    return not number.is_finite or abs(number) <= MAX_NUMBER


class ShapeExpressionError(ValueError):
    """The string is not in the grammar of the shape expressions ``torch.export.save`` writes."""


def _tokens(text: str) -> list[tuple[str, str]]:
    if len(text) > MAX_LENGTH:
        raise ShapeExpressionError(f"longer than {MAX_LENGTH} characters")
    tokens, position = [], 0
    while position < len(text.rstrip(" ")):
        match = TOKEN.match(text, position)
        if not match:
            raise ShapeExpressionError(
                f"unexpected character {text[position : position + 1]!r} at {position}"
            )
        kind = match.lastgroup or ""
        tokens.append((kind, match.group(kind)))
        position = match.end()
    return tokens


class _Parser:
    """Recursive descent over ``_tokens``; every method consumes what it parses and returns its value."""

    def __init__(self, text: str) -> None:
        self.tokens = _tokens(text)
        self.position = 0

    def parse(self) -> sympy.Basic:
        value = self.expression(0)
        if self.position != len(self.tokens):
            raise ShapeExpressionError(f"unexpected {self.tokens[self.position][1]!r} after the expression")
        return value

    def take(self, kind: str, value: str | None = None) -> str:
        if self.position >= len(self.tokens):
            raise ShapeExpressionError(f"ends where a {value or kind} was expected")
        token_kind, token = self.tokens[self.position]
        if token_kind != kind or (value is not None and token != value):
            raise ShapeExpressionError(f"{token!r} where a {value or kind} was expected")
        self.position += 1
        return token

    def peek(self, value: str) -> bool:
        return self.position < len(self.tokens) and self.tokens[self.position][1] == value

    def expression(self, depth: int) -> sympy.Basic:
        if depth > MAX_DEPTH:
            raise ShapeExpressionError(f"nested deeper than {MAX_DEPTH} calls")
        name = self.take("name")
        if name in CONSTANTS:
            return CONSTANTS[name]
        self.take("punct", "(")
        if name == "Integer":
            value = sympy.Integer(self.integer())
        elif name == "Rational":
            numerator = self.integer()
            self.take("punct", ",")
            denominator = self.integer()
            if denominator == 0:
                raise ShapeExpressionError("Rational with a zero denominator")
            value = sympy.Rational(numerator, denominator)
        elif name == "Symbol":
            value = self.symbol()
        elif name in FUNCTIONS:
            value = self.function(name, depth)
        else:
            raise ShapeExpressionError(f"{name!r} is not a shape function torch writes")
        self.take("punct", ")")
        return value

    def integer(self) -> int:
        value = int(self.take("int"))
        if abs(value) > MAX_NUMBER:
            raise ShapeExpressionError("an integer beyond 2**128")
        return value

    def symbol(self) -> sympy.Symbol:
        name = self.take("symbol")
        assumptions: dict[str, bool] = {}
        while self.peek(","):
            self.take("punct", ",")
            key = self.take("name")
            if key not in ASSUMPTIONS or key in assumptions:
                raise ShapeExpressionError(f"{key!r} is not a symbol assumption (or is repeated)")
            self.take("punct", "=")
            flag = self.take("name")
            if flag not in ("True", "False"):
                raise ShapeExpressionError(f"assumption {key} is {flag!r}, not True or False")
            assumptions[key] = flag == "True"
        return sympy.Symbol(name, **assumptions)

    def function(self, name: str, depth: int) -> sympy.Basic:
        arguments = [self.expression(depth + 1)]
        while self.peek(","):
            self.take("punct", ",")
            arguments.append(self.expression(depth + 1))
        least, most = ARITY[name]
        flattens = name in FLATTENED
        count = sum(len(a.args) if flattens and a.func is FUNCTIONS[name] else 1 for a in arguments)
        if len(arguments) < least or count > most:
            raise ShapeExpressionError(f"{name} takes {least}..{most} arguments, not {count}")
        if name in POWERS and arguments[1].is_Number and abs(arguments[1]) > MAX_EXPONENT:
            raise ShapeExpressionError(f"{name} with an exponent beyond {MAX_EXPONENT}")
        try:
            value = FUNCTIONS[name](*arguments)
        except Exception as error:  # sympy's and torch's classes raise many kinds (AssertionError too)
            raise ShapeExpressionError(f"{name} refused its arguments ({error})") from error
        if name in POWERS and not all(map(_small, value.atoms(sympy.Number))):
            raise ShapeExpressionError(f"{name} makes a number beyond 2**128")
        return value


def parse_shape_expression(text: str) -> sympy.Basic:
    """The sympy object ``text`` denotes, built from ints and ``Symbol`` names only; raises
    ``ShapeExpressionError`` naming the problem unless ``text`` is in the grammar above."""
    if not isinstance(text, str):
        raise ShapeExpressionError(f"{type(text).__name__}, not a string")
    return _Parser(text).parse()

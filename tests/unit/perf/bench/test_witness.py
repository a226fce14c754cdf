"""``python -m perf witness`` takes frozen options (``WitnessOptions``) built from its own command
line: each field arrives as given, and a value it cannot run with is refused naming its option
(``OptionError``: exit status 2, one line) before any server starts. No server starts here."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from perf.bench.witness import WitnessOptions, witness_parser
from perf.cli import main
from perf.errors import EXIT_USAGE, OptionError


@pytest.mark.parametrize(
    ("values", "option"),
    [
        ({"max_batch": 0}, "--max-batch"),
        ({"delay_us": -1}, "--delay-us"),
        ({"instances": 0}, "--instances"),
        ({"concurrency": 0}, "--concurrency"),
        ({"model": ""}, "--model"),
    ],
)
def test_a_value_the_witness_cannot_run_with_is_refused_naming_its_option(values: dict, option: str) -> None:
    with pytest.raises(OptionError, match=f"^{re.escape(option)} "):
        WitnessOptions(**values)


def every_field_differs_from_its_default(options: object) -> bool:
    """So that a field the command line dropped (left at its default) shows as a difference."""
    return all(
        getattr(options, f.name) != f.default
        for f in dataclasses.fields(options)
        if f.default is not dataclasses.MISSING
    )


def test_the_witness_command_line_carries_each_field_and_defaults_to_its_options() -> None:
    assert WitnessOptions(**vars(witness_parser().parse_args([]))) == WitnessOptions()
    argv = ["--model", "text_encoder", "--spec", "s.yaml", "--max-batch", "4", "--delay-us", "500",
            "--instances", "1", "--concurrency", "4", "--workdir", "w"]  # fmt: skip
    witness = WitnessOptions("text_encoder", Path("s.yaml"), 4, 500, 1, 4, Path("w"))
    assert WitnessOptions(**vars(witness_parser().parse_args(argv))) == witness
    assert every_field_differs_from_its_default(witness)


def test_the_witness_refuses_a_bad_value_as_a_usage_error(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["witness", "--instances", "0"])
    assert exit_info.value.code == EXIT_USAGE
    assert "error: --instances must be >= 1, got 0" in capsys.readouterr().err

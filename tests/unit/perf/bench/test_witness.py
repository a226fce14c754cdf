"""``python -m perf witness`` (``perf.bench.witness``): its frozen options (``WitnessOptions``), built
from its own command line, each field arriving as given and a value it cannot run with refused naming
its option (``OptionError``: exit status 2, one line) before any server starts; and its CPU split, each
run's CPU per request, the server's and the rest of the machine's, with the sentence that says how
much of the throughput gap to perf_analyzer the client's CPU explains (hand-computed cases). No server
starts here."""

from __future__ import annotations

import dataclasses
import math
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
from rich.console import Console

from client.stats import ModelStats
from perf.bench.witness import CSV_ROW, EXPORT_ROW, WitnessOptions, cpu_verdict, options_from, rows
from perf.cli import PerfSetup, main, parser
from perf.errors import EXIT_USAGE, OptionError
from perf.measure.server_view import ServerDelta


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
    assert options_from(parser().parse_args(["witness"])) == WitnessOptions()
    argv = ["witness", "--model", "text_encoder", "--spec", "s.yaml", "--max-batch", "4", "--delay-us", "500",
            "--instances", "1", "--concurrency", "4", "--workdir", "w"]  # fmt: skip
    witness = WitnessOptions("text_encoder", Path("s.yaml"), 4, 500, 1, 4, Path("w"))
    assert options_from(parser().parse_args(argv)) == witness
    assert every_field_differs_from_its_default(witness)


def test_the_witness_refuses_a_bad_value_in_one_line_before_any_server(capsys: pytest.CaptureFixture) -> None:
    assert main(["witness", "--instances", "0"], PerfSetup(Console(width=300))) == EXIT_USAGE
    (line,) = [line for line in capsys.readouterr().out.splitlines() if line.strip()]
    assert line == "witness failed: --instances must be >= 1, got 0"


PA = "perf_analyzer 2.41.0"


def delta(requests: int, busy_cores: float, server_cpu_s: float, seconds: float = 2.0) -> ServerDelta:
    return ServerDelta(seconds, ModelStats(requests=requests), server_cpu_s, 0.0, busy_cores=busy_cores)


def run(engine: str, throughput: float, server: ServerDelta, own=None) -> SimpleNamespace:
    return SimpleNamespace(
        engine=engine, throughput=throughput, p99_ms=9.0, server=server, own=own, stolen_share=0.0
    )


def test_a_runs_cpu_per_request_is_the_servers_and_the_rest_of_the_machines() -> None:
    # 1.5 cores busy over 2 s = 3 CPU seconds, 2 of them the server's, for 2,000 requests
    assert delta(2000, 1.5, 2.0).cpu_ms_per_request() == pytest.approx((1.0, 0.5))
    assert all(math.isnan(value) for value in delta(0, 0.1, 0.0).cpu_ms_per_request())


def test_the_verdict_gives_our_clients_cpu_against_perf_analyzers_and_the_gap_it_explains() -> None:
    # perf_analyzer: server 0.5 ms + client 0.125 ms per request; ours: 0.5 + 0.375 ms
    theirs = [run(PA, 3000.0, delta(6000, 1.875, 3.0)), run(PA, 3000.0, delta(6000, 1.875, 3.0))]
    ours = [run("ours", 2100.0, delta(4000, 1.75, 2.0)), run("ours", 1900.0, delta(4000, 1.75, 2.0))]
    text = cpu_verdict({PA: theirs, "ours": ours})
    # 0.375 / 0.125 = 3.0×; (0.5 + 0.125) / (0.5 + 0.375) - 1 = -28.6%; 2,000 / 3,000 - 1 = -33%
    assert "Our client spends 0.375 ms of CPU per request, 3.0× perf_analyzer's 0.125" in text
    assert "-29% throughput (-33% measured)" in text
    assert cpu_verdict({"ours": ours}) == "No CPU figures for both engines."


def test_perf_analyzers_runs_show_its_own_figure_beside_ours_from_its_export() -> None:
    own = SimpleNamespace(throughput=3010.0, p99_ms=9.1)
    table = rows({PA: [run(PA, 3000.0, delta(6000, 1.875, 3.0), own)], "ours": [run("ours", 2000.0, None)]})
    assert [row[0] for row in table] == [CSV_ROW, EXPORT_ROW, "ours"]
    assert table[0][2:4] == ["3,010", "9.10"] and table[1][2] == "3,000"
    assert table[2][4].startswith("could not be measured")  # no server figures for that run

"""``client health`` reports what the watchdog's record said when the check began.

While the watchdog reloads a model, the server's answers can take seconds; a record read after them may
already say the reload is over. The client here is a plain object answering the four calls ``report``
makes, so the outage can end at a known point of the check.
"""

from __future__ import annotations

from pathlib import Path

from client.health import report
from server.records import write_record

HUNG = "stub of m_0_0 hung (stopped, state T)"


class ReloadEndsWhileAsked:
    """Answers ``report``'s calls; the first one ends the outage in the record (the reload finished)."""

    def __init__(self, record: Path) -> None:
        self.record = record

    def is_server_live(self) -> bool:
        write_record(self.record, {"events": [], "unavailable_now": {}})
        return True

    def is_server_ready(self) -> bool:
        return True

    def is_model_ready(self, name: str) -> bool:
        return True


def test_a_check_that_began_during_an_outage_reports_it(tmp_path: Path) -> None:
    record = tmp_path / "watchdog.json"
    write_record(record, {"events": [], "unavailable_now": {"m": HUNG}})
    text, ok = report(ReloadEndsWhileAsked(record), "http", ["m"], None, record)
    assert f"  m: NOT SERVING: {HUNG}, the watchdog is reloading it" in text.splitlines(), text
    assert not ok


def test_after_the_reload_the_model_serves(tmp_path: Path) -> None:
    record = tmp_path / "watchdog.json"
    write_record(record, {"events": [], "unavailable_now": {}})
    text, ok = report(ReloadEndsWhileAsked(record), "http", ["m"], None, record)
    assert "  m: READY (serving version ?)" in text.splitlines(), text
    assert ok

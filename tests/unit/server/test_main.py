"""``python -m server``'s own messages (the serving itself is tested against real servers)."""

from __future__ import annotations

from server.__main__ import _already_running


def test_a_second_server_in_one_checkout_is_one_line_with_the_holder_and_the_fix() -> None:
    state = {"pid": 4321, "supervisor_pid": 4300, "http": "127.0.0.1:8000", "grpc": "127.0.0.1:8001",
             "repository": "/x/model_repository"}  # fmt: skip
    line = _already_running(state)
    assert "\n" not in line and "pid 4321" in line and "127.0.0.1:8000" in line and "`make stop`" in line

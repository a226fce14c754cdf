"""The supervisor's restart policy (systemd's ``Restart=on-failure`` knobs) and how it names a death."""

from __future__ import annotations

import signal

from server.supervisor import RestartPolicy, death_cause, record_lines

POLICY = RestartPolicy(first_delay_s=1.0, max_delay_s=30.0, burst=5, interval_s=300.0)


def test_the_delay_doubles_with_each_recent_restart_up_to_the_cap() -> None:
    now = 1000.0
    delays = [POLICY.delay([now - 1] * recent, now) for recent in range(7)]
    assert delays == [1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]


def test_restarts_outside_the_interval_are_forgotten() -> None:
    now = 1000.0
    old = [now - 400, now - 350, now - 301]
    assert POLICY.recent(old, now) == 0
    assert POLICY.delay(old, now) == 1.0
    assert not POLICY.exhausted(old * 3, now)


def test_the_start_limit_is_a_burst_inside_the_interval() -> None:
    now = 1000.0
    assert not POLICY.exhausted([now - 10] * 4, now)
    assert POLICY.exhausted([now - 10] * 5, now)
    assert not POLICY.exhausted([now - 10] * 4 + [now - 500], now)


def test_a_death_is_named_by_its_signal_and_the_log_line_that_explains_it() -> None:
    tail = (
        "I1203 model_lifecycle.cc] successfully loaded 'recommender'\n"
        "terminate called after throwing an instance of 'boost::interprocess::lock_exception'\n"
        "  what():  boost::interprocess::lock_exception\n"
        "Signal (6) received.\n"
    )
    assert death_cause(-signal.SIGABRT, tail) == (
        "killed by SIGABRT: terminate called after throwing an instance of "
        "'boost::interprocess::lock_exception'"
    )
    assert death_cause(-signal.SIGKILL, "I1203 nothing to say\n") == "killed by SIGKILL"
    assert death_cause(1, "") == "exited with status 1"


def test_the_record_says_how_often_the_server_was_restarted_and_why() -> None:
    assert record_lines({}) == []
    assert record_lines({"supervisor_pid": 7, "state": "serving", "restarts": 0}) == [
        "  supervisor (pid 7): serving, no restart"
    ]
    (line,) = record_lines(
        {
            "supervisor_pid": 7,
            "state": "serving",
            "restarts": 2,
            "last_cause": "killed by SIGKILL",
            "last_death_at": 100.0,
            "serving_again_at": 109.5,
        }
    )
    assert line.startswith("  supervisor (pid 7): serving; tritonserver restarted 2 time(s); last death at ")
    assert line.endswith(": killed by SIGKILL; serving again after 9.5 s")

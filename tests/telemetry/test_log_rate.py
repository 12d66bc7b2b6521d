"""The log through an outage: one line per cause every ``every_s``, then how many were held."""

from __future__ import annotations

import logging

from gateway.observe.logs import RateLimitFilter


def record(name: str, msg: str, *args: object, level: int = logging.WARNING) -> logging.LogRecord:
    return logging.LogRecord(name, level, __file__, 1, msg, args, None)


def test_a_repeating_cause_is_one_line_per_interval() -> None:
    now = [0.0]
    limit = RateLimitFilter(every_s=10.0, clock=lambda: now[0])
    passed = []
    for step in range(250):  # 25 s of a cause logged 10 times a second
        now[0] = step / 10
        rec = record("backends.fleet.sync", "fleet sync: %s", f"connection refused #{step}")
        if limit.filter(rec):
            passed.append((now[0], rec.getMessage()))
    assert [t for t, _ in passed] == [0.0, 10.0, 20.0]
    assert passed[0][1] == "fleet sync: connection refused #0"
    assert passed[1][1] == ("fleet sync: connection refused #100 "
                            "[99 more like this in the last 10 s]")


def test_causes_are_apart_and_info_is_never_held() -> None:
    now = [0.0]
    limit = RateLimitFilter(every_s=10.0, clock=lambda: now[0])
    assert limit.filter(record("a", "Redis down: %s", "x"))
    assert limit.filter(record("b", "Redis down: %s", "x"))  # another logger: another cause
    assert limit.filter(record("a", "something else"))
    assert not limit.filter(record("a", "Redis down: %s", "y"))
    assert all(limit.filter(record("a", "poll %d", i, level=logging.INFO)) for i in range(5))
    now[0] = 11.0
    rec = record("a", "Redis down: %s", "z")
    assert limit.filter(rec) and rec.getMessage() == (
        "Redis down: z [1 more like this in the last 11 s]")


def test_a_percent_in_the_message_survives() -> None:
    now = [0.0]
    limit = RateLimitFilter(every_s=1.0, clock=lambda: now[0])
    assert limit.filter(record("a", "usage at 100%"))
    assert not limit.filter(record("a", "usage at 100%"))
    now[0] = 2.0
    rec = record("a", "usage at 100%")
    assert limit.filter(rec)
    assert rec.getMessage() == "usage at 100% [1 more like this in the last 2 s]"

"""The gateway's log, kept readable through an outage: one line per cause every few seconds.

A cause is where a record comes from and what it says before its arguments (logger name and
message template): "Redis unreachable" logged by every poll of every loop is one cause. While a
cause repeats, the first record goes out and the rest are counted; the next one let through
says how many were held back. Records below WARNING are never held back.

Example::

    for handler in logging.getLogger().handlers:
        handler.addFilter(RateLimitFilter(every_s=10))
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

MAX_CAUSES = 10_000  # templates are written in code: a bound that is never reached in practice


class RateLimitFilter(logging.Filter):
    def __init__(self, every_s: float = 10.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.every_s = every_s
        self._clock = clock
        self._causes: dict[tuple[str, str], list[float]] = {}  # cause -> [last sent, held back]

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return True
        cause = (record.name, str(record.msg))
        now = self._clock()
        seen = self._causes.get(cause)
        if seen is not None and now - seen[0] < self.every_s:
            seen[1] += 1
            return False
        if seen is None and len(self._causes) >= MAX_CAUSES:
            self._causes.clear()
        held_back = int(seen[1]) if seen is not None else 0
        self._causes[cause] = [now, 0]
        if held_back and seen is not None:
            # No "%" in the suffix: the record's own arguments still format as written.
            record.msg = (f"{record.msg} [{held_back} more like this in the last "
                          f"{int(now - seen[0])} s]")
        return True

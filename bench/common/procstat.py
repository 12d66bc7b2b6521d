"""CPU time of another process, read from /proc: what a benchmark charges to the gateway.

``utime + stime`` in /proc/PID/stat covers every thread of the process, in clock ticks
(usually 10 ms), so measure over enough work that a tick is noise (a second of CPU or more).

Example::

    before = cpu_seconds(pid)
    ...  # drive load
    used_s = cpu_seconds(pid) - before
"""

from __future__ import annotations

import os
from pathlib import Path

CLOCK_TICKS_PER_S = os.sysconf("SC_CLK_TCK")

# Fields after "pid (comm) ": state is field 3, so utime (14) and stime (15) are 11 and 12 here.
_UTIME_INDEX = 11
_STIME_INDEX = 12


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds ``pid`` has used so far (all its threads)."""
    text = Path(f"/proc/{pid}/stat").read_text()
    # comm may contain spaces or parentheses; it ends at the last ')'.
    fields = text[text.rindex(")") + 2:].split()
    return (int(fields[_UTIME_INDEX]) + int(fields[_STIME_INDEX])) / CLOCK_TICKS_PER_S


def cpu_seconds_of(pids: dict[str, int]) -> dict[str, float]:
    return {name: cpu_seconds(pid) for name, pid in pids.items()}


def busy_cpu_seconds() -> float:
    """CPU seconds all processes on the machine have used (all cores), from /proc/stat.

    Compared with the watched processes' share, it shows how much other work (noise) ran.
    """
    with open("/proc/stat") as stat:
        fields = [int(x) for x in stat.readline().split()[1:]]
    idle, iowait = fields[3], fields[4] if len(fields) > 4 else 0
    # user nice system idle iowait irq softirq steal [guest guest_nice: already in user]
    return (sum(fields[:8]) - idle - iowait) / CLOCK_TICKS_PER_S

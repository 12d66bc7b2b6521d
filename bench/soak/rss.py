"""Resident memory of a process, and the figures the soak reads from a series of samples.

``VmRSS`` in /proc/PID/status is what the kernel counts as resident (anonymous, file-backed
and shared pages), in KiB. Example::

    rss_kib(os.getpid())                                         # 31_204
    series = [(0.0, 100_000), (60.0, 120_000), (600.0, 126_000)]
    figures = rss_figures(series, warmup_s=60.0, duration_s=600.0)
    figures["growth_pct"]                                        # 5.0
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

KIB_PER_MIB = 1024


def rss_kib(pid: int) -> int:
    """``VmRSS`` of ``pid`` in KiB; 0 once the process is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


def slope_per_min(points: Sequence[tuple[float, float]]) -> float:
    """Least-squares slope of ``(t_s, value)`` points, per minute; NaN for fewer than two."""
    if len(points) < 2:
        return math.nan
    mean_t = sum(t for t, _ in points) / len(points)
    mean_v = sum(v for _, v in points) / len(points)
    var_t = sum((t - mean_t) ** 2 for t, _ in points)
    if var_t == 0:
        return math.nan
    cov = sum((t - mean_t) * (v - mean_v) for t, v in points)
    return cov / var_t * 60.0


def _at(series: Sequence[tuple[float, int]], t_s: float) -> tuple[float, int]:
    """The sample nearest ``t_s``."""
    return min(series, key=lambda sample: abs(sample[0] - t_s))


def rss_figures(series: Sequence[tuple[float, int]], warmup_s: float,
                duration_s: float) -> dict[str, Any]:
    """RSS after the warm-up and at the end (MiB), growth between them (%), the slope over the
    second half of the run (MiB/min) and over the whole run after the warm-up."""
    if not series:
        return {}
    warm_t, warm_kib = _at(series, warmup_s)
    end_t, end_kib = series[-1]
    mib = [(t, kib / KIB_PER_MIB) for t, kib in series]
    last_half = [(t, v) for t, v in mib if t >= duration_s / 2]
    after_warmup = [(t, v) for t, v in mib if t >= warm_t]
    return {
        "start_mib": series[0][1] / KIB_PER_MIB,
        "warm_t_s": warm_t, "warm_mib": warm_kib / KIB_PER_MIB,
        "end_t_s": end_t, "end_mib": end_kib / KIB_PER_MIB,
        "peak_mib": max(kib for _, kib in series) / KIB_PER_MIB,
        "growth_pct": (end_kib - warm_kib) / warm_kib * 100 if warm_kib else math.nan,
        "slope_last_half_mib_per_min": slope_per_min(last_half),
        "slope_after_warmup_mib_per_min": slope_per_min(after_warmup),
    }

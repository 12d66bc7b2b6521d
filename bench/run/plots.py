"""PNG plots of a run, drawn with matplotlib's object API (no pyplot, no display needed).

- ``ttft_cdf.png`` and ``e2e_cdf.png``: latency CDFs per tier and overall;
- ``throughput.png`` (rate sweeps): achieved throughput and goodput against offered rate.

Example::

    paths = write_plots(out_dir, records, summary)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from bench.run.spec import Record


def _cdf(out_path: Path, series: Mapping[str, Sequence[float]], xlabel: str, title: str) -> None:
    fig = Figure(figsize=(7, 4.5), dpi=100)
    ax = fig.subplots()
    for label, values in series.items():
        if not values:
            continue
        ordered = np.sort(np.asarray(values, dtype=float))
        fraction = np.arange(1, len(ordered) + 1) / len(ordered)
        is_all = label == "all"
        ax.step(ordered, fraction, where="post", label=f"{label} (n={len(ordered)})",
                color="black" if is_all else None, linestyle="--" if is_all else "-")
    if any(series.values()):
        ax.set_xscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel("fraction of requests")
    ax.set_ylim(0, 1.01)
    ax.grid(True, which="both", alpha=0.3)
    ax.set_title(title)
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(out_path)


def _throughput(out_path: Path, phases: Sequence[Mapping[str, Any]]) -> None:
    fig = Figure(figsize=(7, 4.5), dpi=100)
    ax = fig.subplots()
    offered = [p["offered_rps"] for p in phases]
    ax.plot(offered, [p["sent_rps"] for p in phases], "x", color="grey", label="sent (drawn)")
    ax.plot(offered, [p["throughput_rps"] for p in phases], "o-", label="achieved (200s)")
    ax.plot(offered, [p["goodput_rps"] for p in phases], "s-", label="goodput (met SLO)")
    ax.plot(offered, offered, ":", color="grey", label="offered")
    ax.set_xlabel("offered load (requests/s)")
    ax.set_ylabel("requests/s")
    ax.grid(True, alpha=0.3)
    ax.set_title("Throughput against offered rate")
    ax.legend(loc="upper left")
    fig.tight_layout()
    fig.savefig(out_path)


def write_plots(out_dir: Path, records: Sequence[Record],
                summary: Mapping[str, Any]) -> list[Path]:
    """Write the plots that the run's data supports; returns their paths."""
    ok = [r for r in records if r.is_ok]
    tiers = sorted({r.tier for r in ok})
    paths: list[Path] = []
    for name, label, attribute in (("ttft_cdf.png", "TTFT", "ttft_s"),
                                   ("e2e_cdf.png", "end-to-end latency", "e2e_s")):
        def ms(group: Sequence[Record], attribute: str = attribute) -> list[float]:
            return [v * 1000 for r in group if (v := getattr(r, attribute)) is not None]

        series = {tier: ms([r for r in ok if r.tier == tier]) for tier in tiers}
        series["all"] = ms(ok)
        _cdf(out_dir / name, series, f"{label} (ms)", f"{label} CDF per tier")
        paths.append(out_dir / name)
    phases = [p for p in summary["phases"] if p["offered_rps"] is not None]
    if phases:
        _throughput(out_dir / "throughput.png", phases)
        paths.append(out_dir / "throughput.png")
    return paths

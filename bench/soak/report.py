"""The soak's figures per run, its target, the summary table and the results files.

Example::

    run = run_figures(result, warmup_s=60, duration_s=600)
    print(summary_text(document))
    json_path, text_path = write_results(out_dir, document, summary_text(document))
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import orjson

from bench.soak.drive import CACHE_GAUGES, DriveResult
from bench.soak.rss import rss_figures
from gateway.settings import RoutingSettings

TARGET_GROWTH_PCT = 10.0
_COLUMNS = ("run", "RSS @warm-up MiB", "RSS @end MiB", "growth", "slope 2nd half MiB/min",
            "sent", "failed", "req/s", "target < 10 %")


def run_figures(result: DriveResult, warmup_s: float, duration_s: float) -> dict[str, Any]:
    """RSS figures of every watched process, and the gateway's against the target."""
    names = result.samples[0].rss_kib if result.samples else {}
    rss = {name: rss_figures([(s.t_s, s.rss_kib[name]) for s in result.samples],
                             warmup_s, duration_s) for name in names}
    gateway = rss.get("gateway", {})
    growth = gateway.get("growth_pct", math.nan)
    if gateway and gateway["end_t_s"] <= gateway["warm_t_s"]:
        growth = math.nan  # a run no longer than its warm-up measures no growth
    return {"rss": rss, "growth_pct": growth, "caches": cache_fill(result, warmup_s),
            "is_met": None if math.isnan(growth) else bool(growth < TARGET_GROWTH_PCT)}


def cache_bounds() -> dict[str, float]:
    """The bound of each ``CACHE_GAUGES`` cache under the default settings (the soak's)."""
    routing = RoutingSettings()
    return {CACHE_GAUGES[0]: routing.segment_cache_mib * 1024 * 1024,
            CACHE_GAUGES[1]: float(routing.approx_max_blocks)}


def cache_fill(result: DriveResult, warmup_s: float) -> dict[str, dict[str, float | None]]:
    """Per cache gauge: its bound, its value at the warm-up and at most, and when it first
    reached 95 % of its bound (s, None if never): were the caches full before the growth is
    measured?"""
    fill: dict[str, dict[str, float | None]] = {}
    for name, bound in cache_bounds().items():
        series = [(s.t_s, s.gauges[name]) for s in result.samples if name in s.gauges]
        if not series:
            continue
        at_warmup = next((v for t, v in series if t >= warmup_s), series[-1][1])
        full_t = next((t for t, v in series if v >= 0.95 * bound), None)
        fill[name] = {"bound": bound, "at_warmup": at_warmup,
                      "max": max(v for _, v in series), "full_t_s": full_t}
    return fill


def _fmt(value: float | None, spec: str = ".1f") -> str:
    return "-" if value is None or math.isnan(value) else format(value, spec)


def _row(label: str, run: dict[str, Any]) -> tuple[str, ...]:
    gateway = run["figures"]["rss"].get("gateway", {})
    drive = run["drive"]
    return (label, _fmt(gateway.get("warm_mib")), _fmt(gateway.get("end_mib")),
            f"{_fmt(run['figures']['growth_pct'], '+.1f')} %",
            _fmt(gateway.get("slope_last_half_mib_per_min"), "+.2f"),
            f"{drive['num_sent']:,}", f"{drive['num_failed']:,}",
            _fmt(drive["achieved_rate_per_s"]),
            {True: "PASS", False: "FAIL", None: "-"}[run["figures"]["is_met"]])


def summary_text(document: dict[str, Any]) -> str:
    config = document["config"]
    rows = [_COLUMNS, *(_row(label, run) for label, run in document["runs"].items())]
    widths = [max(len(row[i]) for row in rows) for i in range(len(_COLUMNS))]
    lines = [f"Soak: gateway RSS over {config['duration_s']:.0f} s of "
             f"{config['prompts']} prompts at {config['rate_per_s']:g} req/s "
             f"(warm-up {config['warmup_s']:.0f} s), {config['date']}"]
    for row in rows:
        cells = [row[0].ljust(widths[0])]
        cells += [cell.rjust(width) for cell, width in zip(row[1:], widths[1:], strict=True)]
        lines.append("  ".join(cells))
    for label, run in document["runs"].items():
        sim = run["figures"]["rss"].get("sim", {})
        failures = run["drive"]["failures"]
        lines.append(f"{label}: sim RSS {_fmt(sim.get('warm_mib'))} -> "
                     f"{_fmt(sim.get('end_mib'))} MiB; gateway CPU "
                     f"{_fmt(run['gateway_cpu_s'])} s; cores busy besides the gateway "
                     f"{_fmt(run['machine_busy_cores'], '.2f')}; p50 / p99 "
                     f"{_fmt(run['drive']['latency_p50_ms'])} / "
                     f"{_fmt(run['drive']['latency_p99_ms'])} ms"
                     + (f"; failures {failures}" if failures else ""))
        for name, fill in run["figures"].get("caches", {}).items():
            full_t = fill["full_t_s"]
            lines.append(f"    {name}: {_fmt(fill['at_warmup'], ',.0f')} at the warm-up, "
                         f"at most {_fmt(fill['max'], ',.0f')} of {_fmt(fill['bound'], ',.0f')}"
                         ", 95 % of the bound " + ("never reached" if full_t is None
                                                   else f"from {full_t:.0f} s"))
        for label_at, heap in run.get("heap", {}).items():
            lines.append(f"    heap at {label_at}: " + ", ".join(
                f"{name.removesuffix('_mib')} {value:.1f}" for name, value in heap.items())
                + " MiB")
        for site, mib, count in run.get("top_growth_sites", []):
            lines.append(f"    {mib:+8.2f} MiB {count:+9,d} blocks  {site}")
    return "\n".join(lines)


def write_results(out_dir: Path, document: dict[str, Any], summary: str) -> tuple[Path, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = f"soak-{time.strftime('%Y%m%d-%H%M%S')}"
    json_path, text_path = out_dir / f"{stem}.json", out_dir / f"{stem}.txt"
    json_path.write_bytes(orjson.dumps(document, option=orjson.OPT_INDENT_2))
    text_path.write_text(summary + "\n")
    return json_path, text_path

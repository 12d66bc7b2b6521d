"""What a run leaves in ``--out``: ``results.json`` (config, summary, every record) and
``summary.md`` (the tables). Example::

    write_results(out_dir, config, summary, records)
    (out_dir / "summary.md").write_text(markdown(config, summary))
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import orjson

from bench.run.spec import Record


def write_results(out_dir: Path, config: Mapping[str, Any], summary: Mapping[str, Any],
                  records: Sequence[Record]) -> Path:
    """Write ``results.json``: the config, the summary and every record; returns its path."""
    path = out_dir / "results.json"
    document = {"config": config, "summary": summary, "records": [r.to_json() for r in records]}
    path.write_bytes(orjson.dumps(document, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS))
    return path


def _num(value: Any, digits: int = 1) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, int):
        return f"{value:,}"
    return f"{value:,.{digits}f}"


def _latency(stats: Mapping[str, Any], name: str, quantiles: tuple[str, ...]) -> str:
    return " / ".join(_num(stats[name][q]) for q in quantiles)


def _row(label: str, stats: Mapping[str, Any]) -> str:
    cells = [
        label, _num(stats["num_requests"]), _num(stats["num_errors"]),
        _latency(stats, "ttft_ms", ("p50", "p90", "p99")),
        _latency(stats, "tpot_ms", ("p50", "p99")),
        _latency(stats, "e2e_ms", ("p50", "p90", "p99")),
        _num(stats["throughput_rps"], 2), _num(stats["output_tokens_per_s"], 0),
        _num(stats["goodput_rps"], 2),
        _num(None if stats["slo_attainment"] is None else 100 * stats["slo_attainment"], 1),
        _num(stats["cached_fraction"], 3),
    ]
    return "| " + " | ".join(cells) + " |"


def markdown(config: Mapping[str, Any], summary: Mapping[str, Any]) -> str:
    """The summary as markdown tables, with the command that produced it."""
    lines = [
        f"# bench run: {config['workload']} ({config['mode']} loop)", "",
        f"`{config['command']}`", "",
        f"Target {config['url']}, {config['num_tenants']} tenants, seed {config['seed']}; "
        f"window {summary['overall']['window_s']:.1f} s.", "",
        "| tier | requests | errors | TTFT p50 / p90 / p99 (ms) | TPOT p50 / p99 (ms) "
        "| e2e p50 / p90 / p99 (ms) | req/s | output tok/s | goodput req/s | SLO met % "
        "| cached fraction |",
        "| --- |" + " ---: |" * 10,
    ]
    lines += [_row(tier, stats) for tier, stats in summary["tiers"].items()]
    lines += [_row("**all**", summary["overall"]), ""]
    slos = ", ".join(f"{tier} TTFT ≤ {s['ttft_s']:g} s"
                     + (f", TPOT ≤ {s['tpot_s']:g} s" if s["tpot_s"] else "")
                     for tier, s in summary["slos"].items())
    lines += [f"SLOs: {slos}.", ""]
    errors = summary["overall"]["errors_by_status"]
    if errors:
        lines += ["Errors by status: " + ", ".join(f"{k}: {v}" for k, v in errors.items()), ""]
    if len(summary["phases"]) > 1:
        lines += ["| phase | offered req/s | sent req/s | achieved req/s | goodput req/s "
                  "| TTFT p50 / p99 (ms) | errors |", "| ---: |" + " ---: |" * 6]
        lines += [f"| {p['phase']} | {_num(p['offered_rps'], 2)} | {_num(p['sent_rps'], 2)} "
                  f"| {_num(p['throughput_rps'], 2)} "
                  f"| {_num(p['goodput_rps'], 2)} | {_latency(p, 'ttft_ms', ('p50', 'p99'))} "
                  f"| {p['num_errors']} |" for p in summary["phases"]]
        lines.append("")
    workers = summary.get("workers")
    if workers and workers["per_worker"]:
        lines += ["| worker | requests | prompt tokens |", "| --- | ---: | ---: |"]
        lines += [f"| {url} | {_num(d['requests'], 0)} | {_num(d['prompt_tokens'], 0)} |"
                  for url, d in workers["per_worker"].items()]
        lines += ["", f"Load spread (max / mean per worker): requests "
                  f"{_num(workers['max_mean_requests'], 2)}, prompt tokens "
                  f"{_num(workers['max_mean_prompt_tokens'], 2)}.", ""]
    own = summary.get("loadgen")
    if own:
        lines += [f"Load generator: {own['cpu_s']:.2f} CPU-s, {_num(own['cpu_us_per_request'], 0)}"
                  f" CPU-µs per request; max send lag {summary['max_lag_ms']:.1f} ms.", ""]
    return "\n".join(lines)

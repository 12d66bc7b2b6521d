"""Targets, the summary table and the results file of the overhead benchmark.

Example::

    targets = judge(medians)
    print(text_table(medians, targets, num_runs=3))
    path = write_results(results_dir, {"median": medians, ...})
"""

from __future__ import annotations

import math
import os
import platform
import sys
import time
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import orjson


@dataclass(frozen=True, slots=True)
class Target:
    """An upper bound on one median figure; reported as PASS/FAIL, never asserted."""

    key: str
    label: str
    limit: float

    def passed(self, figures: dict[str, float]) -> bool:
        value = figures.get(self.key, math.nan)
        return not math.isnan(value) and value <= self.limit


TARGETS = (
    Target("nonstream.gateway.proxy_cpu_us_per_request", "CPU-µs per non-streaming request", 250),
    Target("stream.gateway.proxy_cpu_us_per_chunk", "CPU-µs per streamed chunk (zero delay)", 25),
    Target("paced_stream.gateway.proxy_cpu_us_per_chunk", "CPU-µs per streamed chunk (paced)",
           25),
    Target("latency.gateway.added_p50_ms", "added latency p50 at 200 req/s (ms)", 1),
    Target("latency.gateway.added_p99_ms", "added latency p99 at 200 req/s (ms)", 5),
    Target("nonstream.gateway.cpu_to_floor_ratio",
           "CPU per non-streaming request, gateway / bare proxy", 1.3),
    Target("nonstream.gateway.redis_cpu_us_per_request",
           "Redis CPU-µs per non-streaming request (c=32)", 20),
    Target("nonstream.gateway64.cpu_to_gateway_ratio",
           "CPU per non-streaming request, 64 backends / 4", 1.2),
    Target("nonstream.gateway_messages.cpu_to_chat_ratio",
           "CPU per non-streaming request, Messages / chat", 1.1),
    Target("nonstream.gateway_responses.cpu_to_chat_ratio",
           "CPU per non-streaming request, Responses / chat", 1.1),
    Target("paced_stream.gateway_messages.cpu_to_chat_ratio",
           "CPU per paced stream, Messages / chat", 1.1),
    Target("paced_stream.gateway_responses.cpu_to_chat_ratio",
           "CPU per paced stream, Responses / chat", 1.1),
)

# (label, figure with {} for "gateway" or "floor", the engine-alone figure or None)
ROWS = (
    ("CPU-µs per non-streaming request (c=32)", "nonstream.{}.proxy_cpu_us_per_request",
     "nonstream.direct.engine_cpu_us_per_request"),
    ("CPU per non-streaming request, gateway / bare proxy", "nonstream.{}.cpu_to_floor_ratio",
     None),
    ("Redis CPU-µs per non-streaming request (c=32)", "nonstream.{}.redis_cpu_us_per_request",
     None),
    ("CPU-µs per non-streaming request, decision modules interpreted",
     "nonstream.{}_interpreted.proxy_cpu_us_per_request", None),
    ("CPU per non-streaming request, interpreted gateway / bare proxy",
     "nonstream.{}_interpreted.cpu_to_floor_ratio", None),
    ("CPU per non-streaming request, compiled / interpreted decision modules",
     "nonstream.{}.cpu_to_interpreted_ratio", None),
    ("CPU-µs per non-streaming request, 64 backends", "nonstream.{}64.proxy_cpu_us_per_request",
     None),
    ("CPU per non-streaming request, 64 backends / 4", "nonstream.{}64.cpu_to_gateway_ratio",
     None),
    ("CPU-µs per paced chunk, 64 backends", "paced_stream.{}64.proxy_cpu_us_per_chunk", None),
    ("CPU-µs per non-streaming Messages request", "nonstream.{}_messages.proxy_cpu_us_per_request",
     None),
    ("CPU per non-streaming request, Messages / chat", "nonstream.{}_messages.cpu_to_chat_ratio",
     None),
    ("CPU-µs per non-streaming Responses request",
     "nonstream.{}_responses.proxy_cpu_us_per_request", None),
    ("CPU per non-streaming request, Responses / chat",
     "nonstream.{}_responses.cpu_to_chat_ratio", None),
    ("CPU per paced stream, Messages / chat", "paced_stream.{}_messages.cpu_to_chat_ratio", None),
    ("CPU per paced stream, Responses / chat", "paced_stream.{}_responses.cpu_to_chat_ratio",
     None),
    ("CPU per relayed event of a paced stream, Messages / chat",
     "paced_stream.{}_messages.cpu_per_chunk_to_chat_ratio", None),
    ("CPU per relayed event of a paced stream, Responses / chat",
     "paced_stream.{}_responses.cpu_per_chunk_to_chat_ratio", None),
    ("CPU-µs per streamed chunk, zero-delay engine", "stream.{}.proxy_cpu_us_per_chunk",
     "stream.direct.engine_cpu_us_per_chunk"),
    ("CPU-µs per stream (67 chunks), zero delay", "stream.{}.proxy_cpu_us_per_request",
     "stream.direct.engine_cpu_us_per_request"),
    ("CPU-µs per streamed chunk, paced 2 ms/token", "paced_stream.{}.proxy_cpu_us_per_chunk",
     "paced_stream.direct.engine_cpu_us_per_chunk"),
    ("CPU per paced chunk, gateway / bare proxy", "paced_stream.{}.cpu_to_floor_ratio", None),
    ("CPU-µs per stream (67 chunks), paced", "paced_stream.{}.proxy_cpu_us_per_request",
     "paced_stream.direct.engine_cpu_us_per_request"),
    ("latency p50 at 200 req/s (ms)", "latency.{}.p50_ms", "latency.direct.p50_ms"),
    ("latency p99 at 200 req/s (ms)", "latency.{}.p99_ms", "latency.direct.p99_ms"),
    ("added latency p50 (ms)", "latency.{}.added_p50_ms", None),
    ("added latency p99 (ms)", "latency.{}.added_p99_ms", None),
    ("CPU-µs per request at 200 req/s", "latency.{}.proxy_cpu_us_per_request",
     "latency.direct.engine_cpu_us_per_request"),
    ("max requests/s (c=64)", "max_rps.{}.requests_per_s", "max_rps.direct.requests_per_s"),
    ("proxy cores busy at max requests/s", "max_rps.{}.proxy_cores_busy", None),
    ("other processes' cores busy at max req/s", "max_rps.{}.others_cores_busy",
     "max_rps.direct.others_cores_busy"),
)
COLUMNS = ("figure", "gateway", "bare proxy", "engine alone", "target", "result")


def judge(figures: dict[str, float]) -> list[dict[str, Any]]:
    return [
        {"key": t.key, "label": t.label, "limit": t.limit, "value": figures.get(t.key, math.nan),
         "passed": t.passed(figures)}
        for t in TARGETS if t.key in figures  # not measured in this mode: not judged
    ]


def _fmt(value: float | None) -> str:
    if value is None or math.isnan(value):
        return "-"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:.2f}" if abs(value) < 10 else f"{value:.1f}"


def _cells(figures: dict[str, float]) -> list[tuple[str, ...]]:
    rows: list[tuple[str, ...]] = []
    for label, template, direct_key in ROWS:
        gateway_key = template.format("gateway")
        target, result = "", ""
        for t in TARGETS:
            if t.key == gateway_key and gateway_key in figures:
                target, result = f"≤ {t.limit:g}", "PASS" if t.passed(figures) else "FAIL"
        direct = figures.get(direct_key) if direct_key else None
        rows.append((label, _fmt(figures.get(gateway_key)),
                     _fmt(figures.get(template.format("floor"))), _fmt(direct), target, result))
    return rows


def text_table(figures: dict[str, float], num_runs: int) -> str:
    rows = [COLUMNS, *_cells(figures)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS))]
    lines = [f"Gateway overhead: medians of {num_runs} run(s)"]
    for row in rows:
        cells = [row[0].ljust(widths[0])]
        cells += [cell.rjust(width) for cell, width in zip(row[1:], widths[1:], strict=True)]
        lines.append("  ".join(cells))
    return "\n".join(lines)


def markdown_table(figures: dict[str, float]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "| --- | ---: | ---: | ---: | --- | --- |"]
    for row in _cells(figures):
        result = f"**{row[5]}**" if row[5] else ""
        lines.append("| " + " | ".join((*row[:5], result)) + " |")
    return "\n".join(lines)


def machine() -> dict[str, Any]:
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.partition(":")[2].strip()
                break
    except OSError:
        pass
    versions = {}
    for package in ("aiohttp", "uvloop", "redis", "orjson"):
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = "absent"
    return {
        "num_cpus": os.cpu_count(), "cpu_model": model, "platform": platform.platform(),
        "python": sys.version.split()[0], "packages": versions, "network": "loopback",
    }


def write_results(results_dir: Path, document: dict[str, Any]) -> Path:
    results_dir.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    path = results_dir / f"overhead-{stamp}.json"
    path.write_bytes(orjson.dumps(document, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS))
    return path

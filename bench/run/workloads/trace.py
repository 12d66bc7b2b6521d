"""Replay of a CSV trace in the Azure LLM inference trace format.

Columns ``TIMESTAMP,ContextTokens,GeneratedTokens`` (others ignored). ``TIMESTAMP`` is either
``2023-11-16 18:15:46.6805900`` (as in the published traces) or seconds as a number. Each row
becomes one request with a unique prompt of ``ContextTokens`` tokens and ``max_tokens`` =
``GeneratedTokens``, arriving at its original offset from the first row divided by
``time_scale`` (2.0 replays twice as fast), so the trace's burstiness is kept. Rows too long
for ``max_context_tokens`` are clipped. Example::

    specs = list(generate(WorkloadOptions(trace_path=Path("bench/traces/azure-conv-sample.csv")),
                          tenants, seed=1))
    specs[1].at_s   # seconds after the first row
"""

from __future__ import annotations

import csv
import random
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import date
from pathlib import Path

from bench.run.spec import RequestSpec, TenantSpec
from bench.run.text import text
from bench.run.workloads.base import WorkloadOptions

SAMPLE_TRACE = Path(__file__).resolve().parents[2] / "traces" / "azure-conv-sample.csv"
_STAMP = re.compile(r"^(\d{4}-\d\d-\d\d)[ T](\d\d):(\d\d):(\d\d(?:\.\d+)?)")
_TEMPLATE_TOKENS = 32  # room left for the chat template around the prompt


@dataclass(frozen=True, slots=True)
class TraceRow:
    """One row of the trace: arrival time (seconds, any origin) and token counts."""

    timestamp_s: float
    num_context_tokens: int
    num_generated_tokens: int


def parse_timestamp(value: str) -> float:
    """Seconds from a trace timestamp: a number, or ``YYYY-MM-DD HH:MM:SS.fffffff``."""
    try:
        return float(value)
    except ValueError:
        pass
    match = _STAMP.match(value.strip())
    if match is None:
        raise ValueError(f"unreadable TIMESTAMP {value!r}: expected seconds or "
                         "'2023-11-16 18:15:46.6805900'")
    day, hours, minutes, seconds = match.groups()
    return (date.fromisoformat(day).toordinal() * 86400.0 + int(hours) * 3600.0
            + int(minutes) * 60.0 + float(seconds))


def read_trace(path: Path) -> list[TraceRow]:
    """The rows of ``path``, sorted by time."""
    with path.open(newline="") as file:
        reader = csv.DictReader(file)
        missing = {"TIMESTAMP", "ContextTokens", "GeneratedTokens"} - set(reader.fieldnames or ())
        if missing:
            raise ValueError(f"{path}: missing column(s) {', '.join(sorted(missing))}; expected "
                             "the Azure trace format TIMESTAMP,ContextTokens,GeneratedTokens")
        rows = [TraceRow(parse_timestamp(row["TIMESTAMP"]), int(row["ContextTokens"]),
                         int(row["GeneratedTokens"])) for row in reader]
    rows.sort(key=lambda row: row.timestamp_s)
    return rows


def generate(options: WorkloadOptions, tenants: Sequence[TenantSpec],
             seed: int) -> Iterator[RequestSpec]:
    """One request spec per trace row, in time order."""
    if not tenants:
        raise ValueError("a workload needs at least one tenant")
    if options.time_scale <= 0:
        raise ValueError(f"time scale must be > 0, got {options.time_scale}")
    rows = read_trace(options.trace_path or SAMPLE_TRACE)
    rng = random.Random(f"{seed}:trace")
    start_s = rows[0].timestamp_s if rows else 0.0
    limit = options.max_context_tokens
    for index, row in enumerate(rows):
        max_tokens = max(1, min(row.num_generated_tokens, limit // 2))
        num_prompt_tokens = max(1, min(row.num_context_tokens, limit - max_tokens)
                                - _TEMPLATE_TOKENS)
        yield RequestSpec(
            index=index, tenant=rng.choice(tenants), max_tokens=max_tokens,
            messages=({"role": "user", "content": text(num_prompt_tokens, rng)},),
            is_stream=options.is_stream,
            at_s=(row.timestamp_s - start_s) / options.time_scale,
        )

"""The numbers of a run, from its records: pure functions, no I/O.

Per tier and overall: TTFT, TPOT and end-to-end p50/p90/p99 (ms), throughput (req/s, output
tok/s), goodput (requests that met their tier's SLO, per second), errors by status, and the
cached-token fraction (sum of cached / sum of prompt tokens). Per phase of a sweep: offered
against achieved rate. Example::

    summary = summarize(records, slos, phases=[Phase(0, 10.0, 0.0, 20.0)])
    summary["overall"]["ttft_ms"]["p99"]
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from bench.common.stats import percentile
from bench.run.options import Slo
from bench.run.spec import Record

QUANTILES = {"p50": 0.50, "p90": 0.90, "p99": 0.99}


@dataclass(frozen=True, slots=True)
class Phase:
    """One phase of a run: its offered rate (None for a closed loop or a trace) and window."""

    index: int
    offered_rps: float | None
    start_s: float
    end_s: float

    @property
    def length_s(self) -> float:
        """How long the phase sent requests for."""
        return self.end_s - self.start_s


def meets_slo(record: Record, slo: Slo | None) -> bool:
    """Succeeded, and (given an SLO) answered in time. Without a stream the whole response is
    the first token, so its end-to-end time stands in for TTFT."""
    if not record.is_ok:
        return False
    if slo is None:
        return True
    first_s = record.ttft_s if record.ttft_s is not None else record.e2e_s
    if first_s is None or first_s > slo.ttft_s:
        return False
    return slo.tpot_s is None or record.tpot_s is None or record.tpot_s <= slo.tpot_s


def error_kind(record: Record) -> str:
    """How a failed request is counted in ``errors_by_status``."""
    if record.status == -1:
        return "cut_off"
    if record.status == 0:
        return "transport"
    if record.status == 200:
        return "200 (broken stream)"
    return str(record.status)


def quantiles_ms(values: Sequence[float]) -> dict[str, float | None]:
    """p50/p90/p99 of ``values`` (seconds) in milliseconds; None for no values."""
    return {name: (percentile(values, q) * 1000 if values else None)
            for name, q in QUANTILES.items()}


def group_stats(records: Sequence[Record], slos: Mapping[str, Slo], window_s: float
                ) -> dict[str, Any]:
    """The figures for one set of records (a tier, a phase, or all) over ``window_s``."""
    ok = [r for r in records if r.is_ok]
    num_output = sum(r.num_completion_tokens or 0 for r in ok)
    with_usage = [r for r in ok if r.num_prompt_tokens and r.num_cached_tokens is not None]
    num_prompt = sum(r.num_prompt_tokens or 0 for r in with_usage)
    num_good = sum(meets_slo(r, slos.get(r.tier)) for r in records)
    per_s = 1.0 / window_s if window_s > 0 else math.nan
    return {
        "num_requests": len(records),
        "num_ok": len(ok),
        "num_errors": len(records) - len(ok),
        "errors_by_status": dict(Counter(error_kind(r) for r in records if not r.is_ok)),
        "ttft_ms": quantiles_ms([r.ttft_s for r in ok if r.ttft_s is not None]),
        "tpot_ms": quantiles_ms([r.tpot_s for r in ok if r.tpot_s is not None]),
        "e2e_ms": quantiles_ms([r.e2e_s for r in ok if r.e2e_s is not None]),
        "throughput_rps": len(ok) * per_s,
        "output_tokens_per_s": num_output * per_s,
        "goodput_rps": num_good * per_s,
        "slo_attainment": num_good / len(records) if records else None,
        "num_prompt_tokens": num_prompt,
        "num_cached_tokens": sum(r.num_cached_tokens or 0 for r in with_usage),
        "cached_fraction": (sum(r.num_cached_tokens or 0 for r in with_usage) / num_prompt
                            if num_prompt else None),
        "window_s": window_s,
    }


def run_window_s(records: Sequence[Record]) -> float:
    """From the start of the run to the last response."""
    ends = [r.sent_at_s + r.e2e_s for r in records if r.e2e_s is not None]
    return max(ends, default=0.0)


def summarize(records: Sequence[Record], slos: Mapping[str, Slo],
              phases: Sequence[Phase]) -> dict[str, Any]:
    """Overall, per-tier and per-phase figures of a run."""
    window_s = run_window_s(records)
    tiers = sorted({r.tier for r in records})
    per_phase = []
    for phase in phases:
        members = [r for r in records if r.phase == phase.index]
        stats = group_stats(members, slos, phase.length_s)
        per_phase.append({"phase": phase.index, "offered_rps": phase.offered_rps,
                          "sent_rps": len(members) / phase.length_s if phase.length_s else None,
                          "start_s": phase.start_s, "end_s": phase.end_s, **stats})
    return {
        "overall": group_stats(records, slos, window_s),
        "tiers": {tier: group_stats([r for r in records if r.tier == tier], slos, window_s)
                  for tier in tiers},
        "phases": per_phase,
        "slos": {tier: {"ttft_s": s.ttft_s, "tpot_s": s.tpot_s} for tier, s in slos.items()},
        "max_lag_ms": max((r.lag_s for r in records), default=0.0) * 1000,
    }

"""N gateway replicas against one, in virtual time: the same workload, seed and profile routed by
1 and by N replicas behind a round-robin front (``SimConfig.num_replicas``), with the
approximate index and the in-flight counts shared through ``sy:approx`` or not.

**Targets**: N replicas that share the index and their in-flight counts (as the gateway does)
route as well as one, within 5 %: TTFT p90 and p99 N / 1 <= 1.05 and cached share N / 1 >= 0.95,
judged for each prefix-aware profile; runs without sharing show the gap sharing closes, those
without peer load the gap it closes, round-robin shows what the front alone does.

Example::

    rows = replica_rows(results)     # RunResults of one mode, replicas 1 and more
    print(replica_table(rows))
    print(verdict_table(replica_verdicts(rows)))
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from bench.routing.report import ratio_of
from bench.vsim.metrics import RunResult
from bench.vsim.modes import ratio_cell, ratio_verdicts
from bench.vsim.profiles import LOAD_BLIND, PROFILES

MAX_TTFT_RATIO = 1.05
MIN_CACHED_RATIO = 0.95
_FIGURES = (("ttft_p90_ms", "ttft_p90_s", 1000.0), ("ttft_p99_ms", "ttft_p99_s", 1000.0),
            ("cached_fraction", "cached_fraction", 1.0),
            ("missed_percent", "missed_fraction", 100.0))


def sharing_label(result: RunResult) -> str:
    if result.num_replicas == 1:
        return "-"
    if PROFILES[result.profile][1] == "none":
        return "n/a"
    return "shared" if result.is_sharing else "not shared"


def peer_load_label(result: RunResult) -> str:
    if result.num_replicas == 1:
        return "-"
    if PROFILES[result.profile][0] in LOAD_BLIND:
        return "n/a"
    return "on" if result.is_peer_load else "off"


def replica_rows(results: Sequence[RunResult]) -> list[dict[str, Any]]:
    """A row per run with more than one replica: its figures and their ratios to the
    one-replica run of the same mode and profile (ratio None where that did not run)."""
    single = {(r.mode, r.profile): r for r in results if r.num_replicas == 1}
    rows = []
    for result in results:
        base = single.get((result.mode, result.profile))
        if result.num_replicas == 1:
            continue
        row: dict[str, Any] = {
            "mode": result.mode, "profile": result.profile, "num_replicas": result.num_replicas,
            "sharing": sharing_label(result), "peer_load": peer_load_label(result),
            "is_judged": (result.is_sharing and result.is_peer_load
                          and PROFILES[result.profile][1] != "none")}
        for name, field, scale in _FIGURES:
            one = None if base is None else getattr(base, field) * scale
            many = getattr(result, field) * scale
            row[name] = {"one": one, "many": many, "ratio": ratio_of(many, one)}
        row["flushes_per_request"] = result.flushes_per_request
        row["scrapes_per_engine_s"] = {
            "one": None if base is None else base.scrapes_per_engine_s,
            "many": result.scrapes_per_engine_s}
        rows.append(row)
    return rows


def replica_verdicts(rows: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The targets of the module docstring, for the judged rows."""
    found = []
    for row in rows:
        if not row["is_judged"]:
            continue
        label = f"{row['profile']} ({row['mode']}), {row['num_replicas']} replicas"
        found += ratio_verdicts("N / 1 replica", label, row, MAX_TTFT_RATIO, MIN_CACHED_RATIO)
    return found


def replica_table(rows: Iterable[Mapping[str, Any]]) -> str:
    """Markdown: a row per run; cells 1 replica / N replicas (ratio N / 1)."""
    def cell(pair: Mapping[str, Any], digits: int) -> str:
        return ratio_cell(pair, "one", "many", digits)

    lines = ["| mode | profile | replicas | approx index | peer load | TTFT p90 (ms) "
             "| TTFT p99 (ms) | cached share | missed (%) | flushes / request "
             "| scrapes / engine / s |",
             "| --- | --- | ---: | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        lines.append(f"| {r['mode']} | {r['profile']} | {r['num_replicas']} | {r['sharing']} "
                     f"| {r['peer_load']} "
                     f"| {cell(r['ttft_p90_ms'], 0)} | {cell(r['ttft_p99_ms'], 0)} "
                     f"| {cell(r['cached_fraction'], 3)} | {cell(r['missed_percent'], 2)} "
                     f"| {r.get('flushes_per_request', 0.0):.2f} "
                     f"| {_scrapes_cell(r.get('scrapes_per_engine_s'))} |")
    return "\n".join(lines)


def _scrapes_cell(pair: Mapping[str, Any] | None) -> str:
    """1 replica / N replicas, or n/a in own mode (nothing is scraped)."""
    if not pair or not pair.get("many"):
        return "n/a"
    one = pair.get("one")
    return f"{one:.2f} / {pair['many']:.2f}" if one else f"{pair['many']:.2f}"

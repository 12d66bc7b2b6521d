"""Own fleet against third-party fleet, side by side: pure functions of the results dict.

For each workload run in both modes (shared-prefix, multi-turn, the hot-prefix pair, each
KV-pressure point) and each pair of profiles compared — the same profile in both modes, and the
third-party ``prefix_affinity (approx)`` against the own fleet's ``prefix_affinity (exact)``
(what an own fleet gets at best) — the ratio third-party / own of TTFT p90 and p99 and of the
cached-token share, the busiest / mean worker (busy time and requests) in each mode, and for
conversations the share of turns kept on the previous turn's worker.

**Targets:** third-party within 10 % of own-fleet: TTFT p90 and p99 ratio <= 1.10 and cached
share ratio >= 0.90, judged for the third-party ``prefix_affinity (approx)`` against the own
fleet's ``prefix_affinity (exact)`` (against its ``(approx)`` where the exact index was not
run). Example::

    results["comparison"] = comparison(results)
    results["targets"] = all_verdicts(results)
    print(document_markdown(results))
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from bench.common.fleet_modes import MODES, key_of
from bench.routing.report import (
    calibration_line,
    fmt,
    markdown,
    ratio_of,
    verdict,
    verdicts,
)

Figures = Mapping[str, Any]
MAX_TTFT_RATIO = 1.10
MIN_CACHED_RATIO = 0.90
APPROX, EXACT = "prefix_affinity (approx)", "prefix_affinity (exact)"
# (third-party profile, own profile): compared where both ran.
PAIRS = (("round_robin", "round_robin"), (APPROX, APPROX), (APPROX, EXACT))
TITLES = {"own": "Own fleet: workers join by heartbeat, KV events (exact index possible)",
          "third-party": "Third-party fleet: the same engines without Redis, listed in "
                         "backends:, load from /metrics, profile discovered, approximate index"}
HEADER = (f"Targets: third-party within 10 % of own-fleet — TTFT p90 and p99 third-party / own "
          f"<= {MAX_TTFT_RATIO:.2f}, cached-token share third-party / own >= "
          f"{MIN_CACHED_RATIO:.2f} — for third-party {APPROX} against own {EXACT} (own "
          f"{APPROX} where the exact index did not run).")


def _workloads(runs: Mapping[str, Any]) -> Iterator[tuple[str, Mapping[str, Figures]]]:
    """One mode's runs as (workload name, profile label -> figures)."""
    if "shared_prefix" in runs:
        yield "shared-prefix", runs["shared_prefix"]
    if "multi_turn" in runs:
        yield "multi-turn", runs["multi_turn"]
    for workload in ("hot", "uniform"):
        pairs = runs.get("hot_prefix", {})
        if pairs:
            yield f"hot-prefix: {workload}", {label: p[workload] for label, p in pairs.items()}
    for point, point_runs in runs.get("kv_pressure", {}).get("points", {}).items():
        yield f"kv-pressure {point}", point_runs


def _row(third: Figures, own: Figures) -> dict[str, Any]:
    def pair(get: Any) -> dict[str, Any]:
        return {"own": get(own), "third_party": get(third)}

    row = {"ttft_p90_ms": pair(lambda f: f["ttft_ms"]["p90"]),
           "ttft_p99_ms": pair(lambda f: f["ttft_ms"]["p99"]),
           "cached_fraction": pair(lambda f: f["cached_fraction"]),
           "busy_max_mean": pair(lambda f: f["busy_max_mean"]),
           "max_mean_requests": pair(lambda f: f["max_mean_requests"]),
           "turns_kept": pair(lambda f: (f.get("turns_kept") or {}).get("share"))}
    return {**row, "ratio": {name: ratio_of(row[name]["third_party"], row[name]["own"])
                             for name in ("ttft_p90_ms", "ttft_p99_ms", "cached_fraction")}}


def comparison(results: Mapping[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """Workload -> one row per pair of profiles that ran in both modes (module docstring)."""
    if any(key_of(mode) not in results for mode in MODES):
        return {}
    own = dict(_workloads(results[key_of("own")]))
    out: dict[str, list[dict[str, Any]]] = {}
    for workload, third in _workloads(results[key_of("third-party")]):
        rows = [{"third_party": t, "own": o, **_row(third[t], own[workload][o])}
                for t, o in PAIRS if t in third and o in own.get(workload, {})]
        if rows:
            out[workload] = rows
    return out


def _judged(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The row the targets judge: approx against exact, else approx against approx."""
    for own in (EXACT, APPROX):
        for row in rows:
            if row["third_party"] == APPROX and row["own"] == own:
                return row
    return None


def comparison_verdicts(compared: Mapping[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """The targets of the module docstring, per workload."""
    found = []
    for workload, rows in compared.items():
        row = _judged(rows)
        if row is None:
            continue
        label = f"{workload}: {row['third_party']} / own {row['own']}"
        ratio = row["ratio"]
        found += [verdict("third-party / own TTFT p90", label, ratio["ttft_p90_ms"],
                           MAX_TTFT_RATIO),
                  verdict("third-party / own TTFT p99", label, ratio["ttft_p99_ms"],
                           MAX_TTFT_RATIO),
                  verdict("third-party / own cached share", label, ratio["cached_fraction"],
                           MIN_CACHED_RATIO, at_least=True)]
    return [{**v, "mode": "third-party / own"} for v in found]


def all_verdicts(results: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Each mode's own targets (`verdicts`), then the comparison's."""
    found = [{**v, "mode": mode} for mode in results["modes"]
             for v in verdicts(results[key_of(mode)])]
    return found + comparison_verdicts(results.get("comparison") or comparison(results))


def _cell(pair: Mapping[str, Any], digits: int, ratio: float | None = None) -> str:
    text = f"{fmt(pair['own'], digits)} / {fmt(pair['third_party'], digits)}"
    return text + (f" (**{fmt(ratio, 2)}**)" if ratio is not None else "")


def comparison_tables(compared: Mapping[str, list[dict[str, Any]]]) -> list[str]:
    """Markdown: one table of all workloads, a row per compared pair."""
    if not compared:
        return []
    lines = ["**Own / third-party, side by side** (cells: own / third-party (ratio "
             "third-party / own))", "",
             "| workload | third-party profile | own profile | TTFT p90 (ms) | TTFT p99 (ms) "
             "| cached share | busiest / mean busy | busiest / mean requests "
             "| turns kept on worker |",
             "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for workload, rows in compared.items():
        for r in rows:
            ratio = r["ratio"]
            lines.append(
                f"| {workload} | {r['third_party']} | {r['own']} "
                f"| {_cell(r['ttft_p90_ms'], 0, ratio['ttft_p90_ms'])} "
                f"| {_cell(r['ttft_p99_ms'], 0, ratio['ttft_p99_ms'])} "
                f"| {_cell(r['cached_fraction'], 3, ratio['cached_fraction'])} "
                f"| {_cell(r['busy_max_mean'], 2)} | {_cell(r['max_mean_requests'], 2)} "
                f"| {_cell(r['turns_kept'], 3)} |")
    return [*lines, ""]


def document_markdown(results: Mapping[str, Any]) -> str:
    """The whole report: targets, calibration, each mode's tables, the comparison, verdicts."""
    lines = [HEADER, "", *calibration_line(results)]
    common = {"rates": results.get("rates", {}), "kv": results.get("kv")}
    for mode in results["modes"]:
        lines += [f"### {TITLES[mode]}", "",
                  markdown({**common, **results[key_of(mode)]}, with_targets=False)]
    lines += comparison_tables(results.get("comparison") or {})
    lines += ["| target | mode | profile | value | limit | met |",
              "| --- | --- | --- | ---: | ---: | --- |"]
    for v in results.get("targets", []):
        lines.append(f"| {v['target']} | {v['mode']} | {v['label']} | {fmt(v['value'], 2)} "
                     f"| {v['limit']} | {'**yes**' if v['is_met'] else 'no'} |")
    return "\n".join(lines)

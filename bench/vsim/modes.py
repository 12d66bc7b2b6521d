"""Own fleet against third-party fleet in virtual time: the same profiles, workload and seed in
both modes (``SimConfig.mode``), side by side, as ``bench/routing/compare.py`` sets the
live benchmark's modes side by side.

Pairs compared: each third-party profile against the same profile on the own fleet, and a
third-party ``*_approx`` profile also against its exact-index variant on the own fleet (what
an own fleet gets at best). **Targets** (``bench/routing/compare.py``'s): third-party
within 10 % of own-fleet, TTFT p90 and p99 third-party / own <= 1.10 and cached share
third-party / own >= 0.90, judged for each third-party ``*_approx`` profile against its exact
variant (against the same approx profile where the exact one did not run).

Example::

    profiles = third_party_profiles(["round_robin", "prefix_affinity"])  # (["round_robin"],
                                                                         #  ["prefix_affinity"])
    rows = comparison({"own": own_results, "third-party": third_party_results})
    print(comparison_table(rows))

The medians of several runs (one per seed)::

    python -m bench.vsim.modes bench/results/vsim-modes-s1.json bench/results/vsim-modes-s2.json
"""

from __future__ import annotations

import json
import statistics
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from backends.fleet.registry import Backend
from bench.common.fleet_modes import Mode
from bench.routing.compare import MAX_TTFT_RATIO, MIN_CACHED_RATIO
from bench.routing.report import fmt, ratio_of, verdict
from bench.vsim.metrics import RunResult
from bench.vsim.profiles import PROFILES, exact_variant

_FIGURES = (("ttft_p90_ms", "ttft_p90_s", 1000.0), ("ttft_p99_ms", "ttft_p99_s", 1000.0),
            ("cached_fraction", "cached_fraction", 1.0))


def third_party_profiles(profiles: Iterable[str]) -> tuple[list[str], list[str]]:
    """``profiles`` that can run on a third-party fleet, and those left out (exact index)."""
    kept: list[str] = []
    skipped: list[str] = []
    for profile in profiles:
        (skipped if PROFILES[profile][1] == "exact" else kept).append(profile)
    return kept, skipped


def fleet_view(backends: Sequence[Backend]) -> dict[str, Any]:
    """How the gateway knew its backends at the end of a run, as ``bench/common/fleet_modes.py``
    ``describe`` reads ``/admin/fleet``: membership and load sources, each profile field's
    source, the max batch it knew."""
    return {"sources": sorted({b.source for b in backends}),
            "load_sources": sorted({str(b.load_source) for b in backends}),
            "profile_sources": sorted({f"{name}: {source}" for b in backends
                                       for name, source in b.profile_sources.items()}),
            "max_batch": sorted({str(b.profile.max_batch) for b in backends})}


def _pairs(own: Mapping[str, RunResult],
           third: Mapping[str, RunResult]) -> Iterable[tuple[str, str, bool]]:
    """(third-party profile, own profile, is judged) for every pair that ran."""
    for profile in third:
        exact = exact_variant(profile)
        is_approx = PROFILES[profile][1] == "approx"
        has_exact = exact is not None and exact in own
        if profile in own:
            yield profile, profile, is_approx and not has_exact
        if is_approx and has_exact:
            assert exact is not None
            yield profile, exact, True


def comparison(results: Mapping[Mode, Sequence[RunResult]]) -> list[dict[str, Any]]:
    """One row per compared pair (module docstring): own and third-party figures, ratios."""
    own = {r.profile: r for r in results.get("own", ())}
    third = {r.profile: r for r in results.get("third-party", ())}
    rows = []
    for third_profile, own_profile, is_judged in _pairs(own, third):
        row: dict[str, Any] = {"third_party": third_profile, "own": own_profile,
                               "is_judged": is_judged}
        for name, field, scale in _FIGURES:
            pair = {"own": getattr(own[own_profile], field) * scale,
                    "third_party": getattr(third[third_profile], field) * scale}
            row[name] = {**pair, "ratio": ratio_of(pair["third_party"], pair["own"])}
        rows.append(row)
    return rows


def verdicts(rows: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The targets of the module docstring, for the judged rows."""
    found = []
    for row in rows:
        if not row["is_judged"]:
            continue
        label = f"{row['third_party']} / own {row['own']}"
        found += ratio_verdicts("third-party / own", label, row, MAX_TTFT_RATIO,
                                MIN_CACHED_RATIO)
    return found


def ratio_verdicts(target: str, label: str, row: Mapping[str, Any], max_ttft_ratio: float,
                   min_cached_ratio: float) -> list[dict[str, Any]]:
    """A row's three targets: TTFT p90 and p99 ratios at most, cached share ratio at least."""
    return [verdict(f"{target} TTFT p90", label, row["ttft_p90_ms"]["ratio"], max_ttft_ratio),
            verdict(f"{target} TTFT p99", label, row["ttft_p99_ms"]["ratio"], max_ttft_ratio),
            verdict(f"{target} cached share", label, row["cached_fraction"]["ratio"],
                    min_cached_ratio, at_least=True)]


def ratio_cell(pair: Mapping[str, Any], first: str, second: str, digits: int) -> str:
    """``first / second (**ratio**)`` of a figure's pair."""
    return (f"{fmt(pair[first], digits)} / {fmt(pair[second], digits)} "
            f"(**{fmt(pair['ratio'], 2)}**)")


def median_rows(comparisons: Sequence[Sequence[Mapping[str, Any]]]) -> list[dict[str, Any]]:
    """Each pair's medians over several runs' comparisons (seeds): figures and ratios."""
    by_pair: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
    for rows in comparisons:
        for row in rows:
            by_pair.setdefault((row["third_party"], row["own"]), []).append(row)
    out = []
    for (third_profile, own_profile), runs in by_pair.items():
        median: dict[str, Any] = {"third_party": third_profile, "own": own_profile,
                                  "is_judged": runs[0]["is_judged"], "num_runs": len(runs)}
        for name, _, _ in _FIGURES:
            median[name] = {key: _median([r[name][key] for r in runs])
                            for key in ("own", "third_party", "ratio")}
        out.append(median)
    return out


def _median(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def comparison_table(rows: Iterable[Mapping[str, Any]]) -> str:
    """Markdown: a row per pair; cells own / third-party (ratio third-party / own)."""
    def cell(pair: Mapping[str, Any], digits: int) -> str:
        return ratio_cell(pair, "own", "third_party", digits)

    lines = ["| third-party profile | own profile | TTFT p90 (ms) | TTFT p99 (ms) "
             "| cached share | judged |",
             "| --- | --- | ---: | ---: | ---: | --- |"]
    for r in rows:
        lines.append(f"| {r['third_party']} | {r['own']} | {cell(r['ttft_p90_ms'], 0)} "
                     f"| {cell(r['ttft_p99_ms'], 0)} | {cell(r['cached_fraction'], 3)} "
                     f"| {'yes' if r['is_judged'] else ''} |")
    return "\n".join(lines)


def verdict_table(found: Iterable[Mapping[str, Any]]) -> str:
    lines = ["| target | pair | value | limit | met |", "| --- | --- | ---: | ---: | --- |"]
    for v in found:
        lines.append(f"| {v['target']} | {v['label']} | {fmt(v['value'], 2)} | {v['limit']} "
                     f"| {'**yes**' if v['is_met'] else 'no'} |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m bench.vsim.modes A.json B.json ...``: the medians of several ``--mode
    both`` runs' comparisons (e.g. one per seed)."""
    paths = list(sys.argv[1:] if argv is None else argv)
    if not paths:
        print("usage: python -m bench.vsim.modes RUN.json [RUN.json ...]", file=sys.stderr)
        return 2
    comparisons = [json.loads(Path(p).read_text())["comparison"] for p in paths]
    rows = median_rows(comparisons)
    print(f"Medians over {len(paths)} runs (cells: own / third-party (ratio))\n")
    print(comparison_table(rows))
    print()
    print(verdict_table(verdicts(rows)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Targets and tables of ``bench.routing.live``'s results: pure functions of the results dict.

Targets: prefix_affinity's TTFT p50 <= 0.2x and p99 <= 0.25x round_robin's on the
shared-prefix workload; its cached-token fraction >= 90% of the ideal; under a hot prefix its
TTFT p90 <= 1.5x the uniform workload's at the same rate and the busiest worker <= 1.3x the
mean (busy time; the requests' work is judged too, as busy time saturates). Each function
takes one fleet mode's runs (``results["own"]``, with the shared ``rates`` and ``kv``); both
modes side by side: `bench.routing.compare`. Example::

    own = {"rates": results["rates"], "kv": results["kv"], **results["own"]}
    print(markdown({**own, "targets": verdicts(own)}))
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

Figures = Mapping[str, Any]


def ratio_of(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or not denominator:
        return None
    return numerator / denominator


def verdict(target: str, label: str, value: float | None, limit: float,
             at_least: bool = False) -> dict[str, Any]:
    is_met = value is not None and (value >= limit if at_least else value <= limit)
    return {"target": target, "label": label, "value": value, "limit": limit, "is_met": is_met}


def verdicts(results: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Each target against each prefix_affinity variant that was run."""
    found: list[dict[str, Any]] = []
    shared = results.get("shared_prefix", {})
    base = shared.get("round_robin")
    for label, figures in shared.items():
        if not label.startswith("prefix_affinity"):
            continue
        if base is not None:
            for quantile, limit in (("p50", 0.2), ("p99", 0.25)):
                found.append(verdict(f"TTFT {quantile} / round_robin's", label, ratio_of(
                    figures["ttft_ms"][quantile], base["ttft_ms"][quantile]), limit))
        found.append(verdict("cached fraction / ideal", label, figures["share_of_ideal"], 0.9,
                              at_least=True))
    for label, pair in results.get("hot_prefix", {}).items():
        hot, uniform = pair["hot"], pair["uniform"]
        found.append(verdict("hot TTFT p90 / uniform's", label,
                              ratio_of(hot["ttft_ms"]["p90"], uniform["ttft_ms"]["p90"]), 1.5))
        found.append(verdict("hot: busiest / mean busy time", label, hot["busy_max_mean"], 1.3))
        found.append(verdict("hot: busiest / mean request work", label, hot["work_max_mean"],
                              1.3))
    return found


def fmt(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def _row(label: str, f: Figures) -> str:
    ttft = f["ttft_ms"]
    return (f"| {label} | {fmt(ttft['p50'])} / {fmt(ttft['p90'])} / {fmt(ttft['p99'])} "
            f"| {fmt(f['throughput_rps'], 1)} | {fmt(f['cached_fraction'], 3)} "
            f"| {fmt(f['ideal_cached_fraction'], 3)} | {fmt(f['share_of_ideal'], 2)} "
            f"| {fmt(f.get('expected_cached_fraction'), 3)} "
            f"| {fmt(f['max_mean_requests'], 2)} | {fmt(f['busy_max_mean'], 2)} "
            f"| {fmt(f['work_max_mean'], 2)} | {_misses(f)} "
            f"| {fmt(f.get('ttft_with_warmup_ms', {}).get('p99'))} | {f['num_errors']} |")


def _misses(f: Figures) -> str:
    misses = f.get("misses")
    if not misses or misses["miss_share"] is None:
        return "-"
    return (f"{misses['miss_share']:.1%}: {fmt(misses['ttft_hit_ms']['p50'])} / "
            f"{fmt(misses['ttft_missed_ms']['p50'])}")


_HEADER = ("| profile | TTFT p50 / p90 / p99 (ms) | req/s | cached | ideal | share of ideal "
           "| router expected | max/mean requests | max/mean busy | max/mean work "
           "| missed: TTFT p50 hit / missed (ms) | TTFT p99 with warm-up | errors |\n"
           "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: "
           "| ---: |")


def _top_group(f: Figures) -> str:
    top = f.get("top_group")
    if not top:
        return "-"
    placed = " / ".join(str(n) for n in top["requests_per_worker"].values())
    return f"{top['share']:.0%}: {placed}"


def _runs_table(title: str, runs: Mapping[str, Figures]) -> list[str]:
    warmup_s = max((f.get("warmup_s", 0.0) for f in runs.values()), default=0.0)
    if warmup_s:
        title += f" (requests sent in the first {warmup_s:g} s are warm-up, left out)"
    return [f"**{title}**", "", _HEADER, *(_row(label, f) for label, f in runs.items()), ""]


def _kv(results: Mapping[str, Any]) -> str:
    kv = results.get("kv")
    if not kv or kv["num_kv_blocks"] is None:
        return "worker KV: the sim's default, 24,576 blocks (no cache pressure)"
    return (f"worker KV = {kv['fraction']:.0%} of the {kv['working_set_blocks']}-block working "
            f"set ({kv['num_kv_blocks']} blocks)")


def calibration_line(results: Mapping[str, Any]) -> list[str]:
    """The calibration and the rates it set, as a paragraph (none without a calibration)."""
    if "calibration" not in results:
        return []
    c, rates = results["calibration"], results.get("rates", {})
    return [f"Calibration ({c.get('mode', 'own')} fleet, round_robin, closed loop, "
            f"{c['concurrency']} in flight, {_kv(results)}): "
            f"{c['capacity_rps']:.1f} req/s, busy fraction per worker "
            + ", ".join(f"{v:.2f}" for v in c["busy_fraction_per_worker"].values())
            + f"; main rate {rates['main_rps']:.1f} req/s, hot-prefix rate "
            f"{rates['hot_rps']:.1f} req/s.", ""]


def _turns_kept(runs: Mapping[str, Figures]) -> list[str]:
    kept = [f"{label} {fmt(f['turns_kept']['share'], 3)} of {f['turns_kept']['num_turns']}"
            for label, f in runs.items() if f.get("turns_kept")]
    return [f"Turns served by the previous turn's worker: {'; '.join(kept)}.", ""] if kept else []


def markdown(results: Mapping[str, Any], with_targets: bool = True) -> str:
    """The results as markdown tables, targets last (unless ``with_targets`` is False)."""
    lines: list[str] = []
    rates = results.get("rates", {})
    kv_text = _kv(results)
    lines += calibration_line(results)
    if "shared_prefix" in results:
        lines += _runs_table(f"Shared prefix at {rates['main_rps']:.1f} req/s, {kv_text}",
                             results["shared_prefix"])
    if "multi_turn" in results:
        lines += _runs_table(f"Multi-turn at {rates['main_rps']:.1f} req/s, {kv_text}",
                             results["multi_turn"])
        lines += _turns_kept(results["multi_turn"])
    if "hot_prefix" in results:
        lines += [f"**Hot prefix: one group 30% of {rates['hot_rps']:.1f} req/s, against "
                  f"uniform groups at the same rate, {kv_text}**", "",
                  "| profile | workload | TTFT p50 / p90 / p99 (ms) | max/mean busy "
                  "| max/mean work | max/mean in flight | max/mean requests "
                  "| top group: share, requests per worker | errors |",
                  "| --- | --- | ---: | ---: | ---: | ---: | ---: | --- | ---: |"]
        for label, pair in results["hot_prefix"].items():
            for workload in ("uniform", "hot"):
                f = pair[workload]
                ttft = f["ttft_ms"]
                lines.append(
                    f"| {label} | {workload} | {fmt(ttft['p50'])} / {fmt(ttft['p90'])} / "
                    f"{fmt(ttft['p99'])} | {fmt(f['busy_max_mean'], 2)} "
                    f"| {fmt(f['work_max_mean'], 2)} | {fmt(f['in_flight_max_mean'], 2)} "
                    f"| {fmt(f['max_mean_requests'], 2)} | {_top_group(f)} "
                    f"| {f['num_errors']} |")
        lines.append("")
    if "kv_pressure" in results:
        kv = results["kv_pressure"]
        for point, runs in kv["points"].items():
            blocks = next(iter(runs.values()))["num_kv_blocks"] if runs else "-"
            lines += _runs_table(f"KV pressure: worker KV = {point} of the "
                                 f"{kv['working_set_blocks']}-block working set ({blocks} "
                                 f"blocks), {rates['main_rps']:.1f} req/s", runs)
    if not with_targets:
        return "\n".join(lines)
    lines += ["| target | profile | value | limit | met |", "| --- | --- | ---: | ---: | --- |"]
    for v in results.get("targets", []):
        lines.append(f"| {v['target']} | {v['label']} | {fmt(v['value'], 2)} | {v['limit']} "
                     f"| {'**yes**' if v['is_met'] else 'no'} |")
    return "\n".join(lines)

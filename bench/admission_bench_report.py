"""Targets and Markdown tables of the admission benchmark, from its results document (pure).

Example::

    targets = judge(document)             # [{"label", "value", "limit", "op", "passed"}]
    print(markdown(document, targets))
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

TARGET_LEVEL = 2.0
MODES = ("on", "off")
TIER_NAMES = ("interactive", "standard", "batch")


def _get(document: dict[str, Any], *path: str | int | float) -> Any:
    node: Any = document
    for part in path:
        if node is None:
            return None
        node = node.get(part) if isinstance(node, dict) else node[int(part)]
    return node


def level_run(document: dict[str, Any], level: float, mode: str) -> dict[str, Any] | None:
    for run in document["levels"]:
        if math.isclose(run["level"], level) and run["mode"] == mode:
            return dict(run)
    return None


def judge(document: dict[str, Any]) -> list[dict[str, Any]]:
    """Each target of the issue with its value and verdict; a missing value fails."""
    on = level_run(document, TARGET_LEVEL, "on") or {}
    off = level_run(document, TARGET_LEVEL, "off") or {}
    capacity = document["capacity"]["capacity_rps"]
    goodput_on = _get(on, "figures", "goodput_rps")
    goodput_off = _get(off, "figures", "goodput_rps")
    rows: list[tuple[str, Any, float, str]] = [
        ("interactive: share of offered meeting the TTFT SLO at 2x",
         _get(on, "figures", "tiers", "interactive", "attainment_offered"), 0.99, ">="),
        ("standard: share of admitted meeting the TTFT SLO at 2x",
         _get(on, "figures", "tiers", "standard", "attainment_admitted"), 0.95, ">="),
        ("goodput at 2x / capacity at 1x",
         goodput_on / capacity if goodput_on is not None and capacity else None, 0.90, ">="),
        ("goodput at 2x: admission on / FIFO",
         goodput_on / goodput_off if goodput_on is not None and goodput_off else None,
         1.0, ">"),
        ("Jain index, 9 equal-weight tenants, at 2x",
         _get(on, "figures", "fairness", "jain_equal_weight"), 0.95, ">="),
        ("quota: error of admitted against the allowance, 3 replicas (%)",
         abs(document["quota"]["error_pct"]) if document["quota"].get("error_pct") is not None
         else None, 1.0, "<="),
    ]
    checks: dict[str, Callable[[float, float], bool]] = {
        ">=": lambda v, lim: v >= lim, ">": lambda v, lim: v > lim, "<=": lambda v, lim: v <= lim}
    return [{"label": label, "value": value, "limit": limit, "op": op,
             "passed": value is not None and checks[op](value, limit)}
            for label, value, limit, op in rows]


def costs_table(costs: dict[str, Any]) -> str:
    """The admission cost per set-up (medians of the runs)."""
    return _table(["set-up", "gateway CPU-µs / request", "Redis CPU-µs / request",
                   "req/s (c=4)", "p50 (ms)",
                   "EVALSHA / request", "quota round trips / request",
                   "commands inside scripts / request", "other Redis calls / request"],
                  [[name, c["gateway_cpu_us_per_request"], c["redis_cpu_us_per_request"],
                    c["requests_per_s"], c["p50_ms"],
                    c["evalsha_per_request"], c.get("quota_round_trips_per_request", "-"),
                    c["script_commands_per_request"], c["other_redis_calls_per_request"]]
                   for name, c in costs.items()])


def _fmt(value: Any, digits: int = 3) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        if math.isnan(value):
            return "-"
        if abs(value) >= 100:
            return f"{value:,.0f}"
        return f"{value:.{digits}g}"
    return str(value)


def _table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |",
             "| " + " | ".join("---" if i == 0 else "---:" for i in range(len(header))) + " |"]
    lines += ["| " + " | ".join(_fmt(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def _tier(run: dict[str, Any], tier: str, *path: str) -> Any:
    return _get(run, "figures", "tiers", tier, *path)


def markdown(document: dict[str, Any], targets: Sequence[dict[str, Any]]) -> str:
    """Every table of docs/benchmarks.md's section, in order."""
    capacity = document["capacity"]
    out = [f"Capacity at 1x: **{capacity['capacity_rps']:.2f} req/s** "
           f"(closed-loop saturation {capacity['saturation_rps']:.2f} req/s).", "",
           _table(["FIFO rate (req/s)", "standard TTFT p99 (ms)", "interactive TTFT p99 (ms)",
                   "goodput (req/s)", "under SLO"],
                  [[s["rate_rps"], s["standard_ttft_p99_ms"], s["interactive_ttft_p99_ms"],
                    s["goodput_rps"], "yes" if s["is_under_slo"] else "no"]
                   for s in capacity["sweep"]]), ""]
    runs = [(run["level"], run["mode"], run) for run in document["levels"]]
    out += [_table(["load", "admission", "offered (req/s)", "goodput (req/s)",
                    "goodput / capacity", "SLO met, offered: I / S / B",
                    "SLO met, admitted: I / S / B"],
                   [[f"{level:g}x", mode, _get(run, "figures", "offered_rps"),
                     _get(run, "figures", "goodput_rps"),
                     _get(run, "figures", "goodput_rps") / capacity["capacity_rps"],
                     " / ".join(_fmt(_tier(run, t, "attainment_offered")) for t in TIER_NAMES),
                     " / ".join(_fmt(_tier(run, t, "attainment_admitted")) for t in TIER_NAMES)]
                    for level, mode, run in runs]), ""]
    out += [_table(["load", "admission", "TTFT p50 / p99 (ms): interactive", "standard",
                    "batch"],
                   [[f"{level:g}x", mode] + [
                       f"{_fmt(_tier(run, t, 'ttft_ms', 'p50'))} / "
                       f"{_fmt(_tier(run, t, 'ttft_ms', 'p99'))}" for t in TIER_NAMES]
                    for level, mode, run in runs]), ""]
    out += [_table(["load", "admission", "rejections by reason (gateway /metrics)",
                    "HTTP statuses (I / S / B)"],
                   [[f"{level:g}x", mode,
                     ", ".join(f"{k} {v:.0f}" for k, v in sorted(run["rejections"].items()))
                     or "none",
                     " / ".join(", ".join(f"{k}: {v}" for k, v in sorted(
                         (_tier(run, t, "statuses") or {}).items())) for t in TIER_NAMES)]
                    for level, mode, run in runs]), ""]
    out += [_table(["load", "admission", "interactive rejected (another interactive pending)",
                    "admitted but late: interactive", "standard (TTFT range, ms)"],
                   [[f"{level:g}x", mode,
                     f"{_tier(run, 'interactive', 'num_rejected')} "
                     f"({_tier(run, 'interactive', 'num_rejected_while_pending')})",
                     _tier(run, "interactive", "late_admitted", "num"),
                     f"{_tier(run, 'standard', 'late_admitted', 'num')} "
                     f"({_fmt(_tier(run, 'standard', 'late_admitted', 'min_ttft_ms'))}-"
                     f"{_fmt(_tier(run, 'standard', 'late_admitted', 'max_ttft_ms'))})"]
                    for level, mode, run in runs]), ""]
    out += [_table(["load", "admission", "Jain (9 equal tenants)", "light tenants' service",
                    "heavy tenant's service", "heavy / max-min fair share",
                    "Jain vs max-min shares (10)"],
                   [[f"{level:g}x", mode] + [_get(run, "figures", "fairness", key) for key in (
                       "jain_equal_weight", "light_normalised_service_mean",
                       "heavy_normalised_service", "heavy_service_over_max_min_share",
                       "jain_max_min")]
                    for level, mode, run in runs]), ""]
    out += [_table(["load", "admission", "standard tier: Jain (9)", "light service",
                    "heavy service", "heavy / max-min share", "interactive: heavy / max-min",
                    "batch: heavy / max-min"],
                   [[f"{level:g}x", mode] + [_get(run, "figures", "fairness_by_tier", "standard",
                                                  key) for key in (
                       "jain_equal_weight", "light_normalised_service_mean",
                       "heavy_normalised_service", "heavy_service_over_max_min_share")] + [
                       _get(run, "figures", "fairness_by_tier", tier,
                            "heavy_service_over_max_min_share") for tier in ("interactive",
                                                                             "batch")]
                    for level, mode, run in runs]), ""]
    quota = document["quota"]
    out += [_table(["replicas", "limit (req/min)", "sent", "window (s)", "admitted",
                    "GCRA allowance", "error", "steady rate error"],
                   [[quota["num_replicas"], quota["rpm"], quota["num_sent"], quota["window_s"],
                     quota["num_admitted"], quota["allowance"], f"{_fmt(quota['error_pct'])}%",
                     f"{_fmt(quota.get('steady_rate_error_pct'))}%"]]), ""]
    out += [costs_table(document["costs"]), ""]
    out += [_table(["target", "value", "limit", "result"],
                   [[t["label"], t["value"], f"{t['op']} {t['limit']:g}",
                     "**PASS**" if t["passed"] else "**FAIL**"] for t in targets])]
    return "\n".join(out)

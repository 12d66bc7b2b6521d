"""Targets and Markdown tables of the admission benchmark, from its results document (pure).

Each fleet mode run (``document["own"]``, ``document["third_party"]``: capacity, levels, retry)
is judged on its own, at 2x its capacity: interactive SLO met for >= 99 % of offered, standard
>= 95 % of admitted, goodput >= 0.95 x capacity and above FIFO's, Jain over the 9 equal
tenants and against the weighted max-min fair shares within each tier >= 0.95, batch never
starved (first tokens served, and no stretch of the send window over `MAX_BATCH_GAP_S`
without one), and >= 80 % of the
first retries after a refusal's Retry-After admitted; the quota once. Example::

    targets = judge(document)             # [{"mode", "label", "value", "limit", "op", "passed"}]
    print(markdown(document, targets))
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

TARGET_LEVEL = 2.0
MODES = ("on", "off")
TIER_NAMES = ("interactive", "standard", "batch")
MAX_BATCH_GAP_S = 10.0
FLEET_MODES = (("own", "own"), ("third_party", "third-party"))  # (document key, name)
TITLES = {"own": "Own fleet: workers join by heartbeat",
          "third-party": "Third-party fleet: the same engines without Redis, listed in "
                         "backends:, load from /metrics, profile discovered"}


def _get(document: Mapping[str, Any] | None, *path: str | int | float) -> Any:
    node: Any = document
    for part in path:
        if node is None:
            return None
        node = node.get(part) if isinstance(node, dict) else node[int(part)]
    return node


def level_run(run: Mapping[str, Any], level: float, mode: str) -> dict[str, Any] | None:
    """One level's run (admission ``mode`` on or off) of a fleet mode's results."""
    for level_result in run["levels"]:
        if math.isclose(level_result["level"], level) and level_result["mode"] == mode:
            return dict(level_result)
    return None


def fleet_runs(document: Mapping[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(fleet mode name, its results) for each mode the document holds."""
    return [(name, document[key]) for key, name in FLEET_MODES if key in document]


def _batch_gap(run: Mapping[str, Any] | None) -> float | None:
    """The 2x run's longest batch gap; None (a failure) when batch got no first token."""
    batch = _get(run, "figures", "tiers", "batch") or {}
    return batch.get("longest_gap_s") if batch.get("num_first_tokens_in_window") else None


def mode_targets(run: Mapping[str, Any]) -> list[tuple[str, Any, float, str]]:
    """One fleet mode's targets: (label, value, limit, op)."""
    on = level_run(run, TARGET_LEVEL, "on") or {}
    off = level_run(run, TARGET_LEVEL, "off") or {}
    capacity = run["capacity"]["capacity_rps"]
    goodput_on = _get(on, "figures", "goodput_rps")
    goodput_off = _get(off, "figures", "goodput_rps")
    return [
        ("interactive: share of offered meeting the TTFT SLO at 2x",
         _get(on, "figures", "tiers", "interactive", "attainment_offered"), 0.99, ">="),
        ("standard: share of admitted meeting the TTFT SLO at 2x",
         _get(on, "figures", "tiers", "standard", "attainment_admitted"), 0.95, ">="),
        ("goodput at 2x / capacity at 1x",
         goodput_on / capacity if goodput_on is not None and capacity else None, 0.95, ">="),
        ("goodput at 2x: admission on / FIFO",
         goodput_on / goodput_off if goodput_on is not None and goodput_off else None,
         1.0, ">"),
        ("Jain index, 9 equal-weight tenants, at 2x",
         _get(on, "figures", "fairness", "jain_equal_weight"), 0.95, ">="),
        ("Jain index against the weighted max-min fair shares within each tier, at 2x",
         _get(on, "figures", "jain_max_min_within_tiers"), 0.95, ">="),
        ("batch never starved at 2x: longest stretch without a batch first token (s)",
         _batch_gap(on), MAX_BATCH_GAP_S, "<="),
        ("retries at 2x: share of first retries (after Retry-After) admitted",
         _get(run, "retry", "retries", "admitted_share"), 0.80, ">="),
    ]


def judge(document: dict[str, Any]) -> list[dict[str, Any]]:
    """Each target with its value and verdict, per fleet mode, then the quota's; a missing
    value fails."""
    rows = [(name, *target) for name, run in fleet_runs(document)
            for target in mode_targets(run)]
    quota = document.get("quota")
    if quota is not None:  # None: run without the mock fleet (--no-mock)
        rows.append(("-", "quota: error of admitted against the allowance, 3 replicas (%)",
                     abs(quota["error_pct"]) if quota.get("error_pct") is not None else None,
                     1.0, "<="))
    checks: dict[str, Callable[[float, float], bool]] = {
        ">=": lambda v, lim: v >= lim, ">": lambda v, lim: v > lim, "<=": lambda v, lim: v <= lim}
    return [{"mode": mode, "label": label, "value": value, "limit": limit, "op": op,
             "passed": value is not None and checks[op](value, limit)}
            for mode, label, value, limit, op in rows]


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


def mode_tables(results: dict[str, Any]) -> list[str]:
    """One fleet mode's tables: capacity, levels, TTFT, rejections, fairness, retries."""
    capacity = results["capacity"]
    out = [f"Capacity at 1x: **{capacity['capacity_rps']:.2f} req/s** "
           f"(closed-loop saturation {capacity['saturation_rps']:.2f} req/s).", "",
           _table(["FIFO rate (req/s)", "standard TTFT p99 (ms)", "interactive TTFT p99 (ms)",
                   "goodput (req/s)", "under SLO"],
                  [[s["rate_rps"], s["standard_ttft_p99_ms"], s["interactive_ttft_p99_ms"],
                    s["goodput_rps"], "yes" if s["is_under_slo"] else "no"]
                   for s in capacity["sweep"]]), ""]
    runs = [(run["level"], run["mode"], run) for run in results["levels"]]
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
                    "Jain vs max-min shares across tiers (10)",
                    "Jain vs weighted max-min shares within tiers"],
                   [[f"{level:g}x", mode] + [_get(run, "figures", "fairness", key) for key in (
                       "jain_equal_weight", "light_normalised_service_mean",
                       "heavy_normalised_service", "heavy_service_over_max_min_share",
                       "jain_max_min")] + [_get(run, "figures", "jain_max_min_within_tiers")]
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
    return out + retry_table(results.get("retry"))


def retry_table(retry: dict[str, Any] | None) -> list[str]:
    """The retry run: per retrying tier, refusals, retries, and of these admitted / in SLO."""
    if not retry:
        return []
    figures = retry["retries"]
    rows = [("all", figures), *figures["by_tier"].items()]
    return [f"Retries at {retry['rate_rps']:.2f} req/s: clients of "
            f"{', '.join(figures['tiers'])} ({retry['policy']['fraction']:.0%} of their keys) "
            "retry a refusal once, after its Retry-After.", "",
            _table(["tier", "refused", "with Retry-After", "Retry-After (s)", "retried",
                    "admitted", "refused again", "unresolved", "admitted share",
                    "within TTFT SLO", "late vs Retry-After, max (ms)"],
                   [[tier, f["num_refused"], f["num_with_retry_after"],
                     f"{_fmt(f['retry_after_s']['min'])}-{_fmt(f['retry_after_s']['max'])}",
                     f["num_retried"], f["num_admitted"], f["num_refused_again"],
                     f["num_unresolved"], f["admitted_share"], f["met_slo_share"],
                     f["lag_ms_max"]] for tier, f in rows]), ""]


def side_by_side(document: dict[str, Any]) -> list[str]:
    """The 2x figures of every fleet mode, one row each."""
    rows = []
    for name, run in fleet_runs(document):
        on = level_run(run, TARGET_LEVEL, "on") or {}
        capacity = run["capacity"]["capacity_rps"]
        saturation = run["capacity"].get("saturation_rps")
        goodput = _get(on, "figures", "goodput_rps")
        rows.append([name, capacity, capacity / saturation if saturation else None,
                     goodput / capacity if goodput is not None else None,
                     goodput / saturation if goodput is not None and saturation else None,
                     _tier(on, "interactive", "attainment_offered"),
                     _tier(on, "standard", "attainment_admitted"),
                     _get(on, "figures", "fairness", "jain_equal_weight"),
                     _get(on, "figures", "jain_max_min_within_tiers"),
                     _tier(on, "batch", "longest_gap_s"),
                     _get(run, "retry", "retries", "admitted_share"),
                     _retried_share(run),
                     _get(run, "retry", "retries", "met_slo_share"),
                     ", ".join(_get(run, "fleet", "load_sources") or [])])
    return [_table(["fleet", "capacity (req/s)", "capacity / saturation", "goodput / capacity",
                    "goodput / saturation", "interactive (offered)",
                    "standard (admitted)", "Jain (9)", "Jain (max-min in tiers)",
                    "batch gap (s)",
                    "retries admitted", "refusals retried (Retry-After <= 10 s)",
                    "retries in SLO", "load from"], rows), ""]


def _retried_share(run: dict[str, Any]) -> float | None:
    """Of the refusals, the share whose client retried: the rest were told a Retry-After past
    what the benchmark's clients wait (``RetryPolicy.max_wait_s``) and gave up."""
    refused = _get(run, "retry", "retries", "num_refused")
    retried = _get(run, "retry", "retries", "num_retried")
    return retried / refused if refused and retried is not None else None


def quota_table(quota: Mapping[str, Any]) -> str:
    """The quota accuracy phase: admitted through 3 replicas against the GCRA's allowance."""
    return _table(["replicas", "limit (req/min)", "sent", "window (s)", "admitted",
                   "GCRA allowance", "error", "steady rate error"],
                  [[quota["num_replicas"], quota["rpm"], quota["num_sent"], quota["window_s"],
                    quota["num_admitted"], quota["allowance"], f"{_fmt(quota['error_pct'])}%",
                    f"{_fmt(quota.get('steady_rate_error_pct'))}%"]])


def markdown(document: dict[str, Any], targets: Sequence[dict[str, Any]]) -> str:
    """Every table, per fleet mode, then both side by side at 2x, the quota, costs, targets."""
    out: list[str] = []
    for name, run in fleet_runs(document):
        out += [f"### {TITLES[name]}", "", *mode_tables(run)]
    out += [f"### Side by side at {TARGET_LEVEL:g}x, admission on", "", *side_by_side(document)]
    quota = document.get("quota")
    if quota is not None:  # None: run without the mock fleet (--no-mock)
        out += ["### Quota accuracy and admission cost (mock engine, both modes alike)", "",
                quota_table(quota), ""]
    if document.get("costs") is not None:
        out += [costs_table(document["costs"]), ""]
    out += [f"### Targets (each fleet at {TARGET_LEVEL:g}x its own capacity)", "",
            _table(["target", "fleet", "value", "limit", "result"],
                   [[t["label"], t["mode"], t["value"], f"{t['op']} {t['limit']:g}",
                     "**PASS**" if t["passed"] else "**FAIL**"] for t in targets])]
    return "\n".join(out)

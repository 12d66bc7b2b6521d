"""The fault benchmark's figures per scenario, its targets, and the summary tables.

Each figure is summarised over the runs of one scenario and mode as median (min-max); each
target is judged on every run and reported as met in k of N runs. Example::

    summary = summarise(document)          # scenario -> mode -> figure -> {median, min, max}
    print(markdown(document, summary))
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from bench.common.fleet_modes import key_of


@dataclass(frozen=True, slots=True)
class Figure:
    key: str
    label: str
    target: str = ""  # as the table says it
    is_met: Callable[[float], bool] | None = None


def _zero(value: float) -> bool:
    return value == 0


COMMON = (
    Figure("num_requests", "requests sent"),
    Figure("num_failed", "failed before any byte (no 200 head)", "0", _zero),
    Figure("num_cut_error_event", "streams cut, ending with an SSE error event"),
    Figure("num_cut_silent", "streams cut without an error event", "0", _zero),
)
FIGURES: dict[str, tuple[Figure, ...]] = {
    "kill": (
        *COMMON,
        Figure("num_in_flight_on_victim", "requests streaming from the victim when it died"),
        Figure("out_of_routing_s", "kill → out of the routing set (s)"),
        Figure("unhealthy_or_gone_s", "kill → is_healthy false or gone (s)"),
        Figure("gone_s", "kill → gone from /admin/fleet (s)"),
        Figure("num_returns_in_10_s", "flaps back into the routing set in the next 10 s", "0",
               _zero),
    ),
    "stop": (
        *COMMON,
        Figure("num_in_flight_on_victim", "requests streaming from the victim when it "
               "stopped"),
        Figure("worst_in_flight_latency_s", "worst latency of requests out at SIGSTOP (s)"),
        Figure("worst_latency_sent_during_stop_s", "worst latency of requests sent while "
               "stopped (s)"),
        Figure("out_of_routing_s", "SIGSTOP → out of the routing set (s)"),
        Figure("unhealthy_or_gone_s", "SIGSTOP → is_healthy false or gone (s)"),
        Figure("gone_s", "SIGSTOP → gone from /admin/fleet (s)"),
        Figure("back_after_sigcont_s", "SIGCONT → back in the routing set (s)"),
    ),
    "http_500": (
        *COMMON,
        Figure("num_client_visible_failures", "client-visible failures", "0", _zero),
        Figure("faulty_requests_in_warmup", "requests the faulty engine had while ok (3 s)"),
        Figure("faulty_requests_before_ejection", "requests it got answering 500, before "
               "ejection"),
        Figure("ejected_after_s", "500s begin → breaker open (s)"),
        Figure("closed_after_ok_s", "answers ok → breaker closed (s)"),
    ),
    "redis_pause": (
        *COMMON,
        Figure("peak_in_flight", "peak requests out (max_concurrent 48)"),
        Figure("num_429_before_pause", "429s before the pause"),
        Figure("num_429_after_resume", "429s after SIGCONT (phantom leases)", "0", _zero),
        Figure("num_leases_left", "leases left in Redis after the load ended", "0", _zero),
        Figure("num_fail_open", "requests admitted on local limits (fail open)"),
        Figure("served_from_redis_after_s", "SIGCONT → served from Redis again (s)", "< 2",
               lambda v: v < 2),
        Figure("worst_latency_sent_during_pause_s", "worst latency of requests sent in the "
               "pause (s)"),
    ),
    "redis_restart": (
        *COMMON,
        Figure("num_404_model_not_found", "404 model_not_found", "0", _zero),
        Figure("num_401", "401 (the key went with the data, until made again)"),
        Figure("key_made_again_after_s", "Redis up → tenant and key made again (s)"),
        Figure("min_workers_listed", "fewest workers /admin/fleet listed"),
        Figure("workers_known_after_s", "Redis up → every worker known again (s)"),
    ),
}
TITLES = {"kill": "1. kill -9 one worker", "stop": "2. SIGSTOP one worker for 10 s",
          "http_500": "3. a worker answering 500", "redis_pause": "4. Redis SIGSTOP for 3 s",
          "redis_restart": "5. Redis restarted empty"}


def _runs(document: dict[str, Any], scenario: str, mode: str) -> list[dict[str, Any]]:
    return [r for r in document["runs"] if r["scenario"] == scenario and r["mode"] == mode
            and "error" not in r]


def summarise(document: dict[str, Any]) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    for scenario in document["scenarios"]:
        for mode in document["modes"]:
            runs = _runs(document, scenario, mode)
            cells: dict[str, Any] = {}
            for figure in FIGURES[scenario]:
                values = [float(r[figure.key]) for r in runs if r.get(figure.key) is not None]
                cell: dict[str, Any] = {"num_runs": len(runs), "num_values": len(values)}
                if values:
                    cell.update(median=statistics.median(values), min=min(values),
                                max=max(values))
                if figure.is_met is not None:
                    cell["num_met"] = sum(1 for v in values if figure.is_met(v))
                cells[figure.key] = cell
            summary.setdefault(scenario, {})[key_of(mode)] = cells
    return summary


def _fmt(value: float | None) -> str:
    if value is None or math.isnan(value):
        return "-"
    if value == int(value):
        return f"{value:.0f}"
    return f"{value:.2f}"


def _cell(cell: dict[str, Any]) -> str:
    if "median" not in cell:
        return f"none in {cell['num_runs']}"
    text = _fmt(cell["median"])
    if cell["min"] != cell["max"]:
        text += f" ({_fmt(cell['min'])}-{_fmt(cell['max'])})"
    if cell["num_values"] < cell["num_runs"]:
        text += f" [{cell['num_runs'] - cell['num_values']} never]"
    return text


def markdown(document: dict[str, Any], summary: dict[str, Any]) -> str:
    modes = [key_of(m) for m in document["modes"]]
    head = "| figure | " + " | ".join(m.replace("_", "-") for m in modes) + " | target | met |"
    lines = [f"Medians (min-max) of {document['num_runs']} run(s) per scenario and mode."]
    for scenario in document["scenarios"]:
        lines += ["", f"**{TITLES[scenario]}**", "", head,
                  "| --- |" + " ---: |" * len(modes) + " --- | --- |"]
        for figure in FIGURES[scenario]:
            cells = [summary[scenario][m][figure.key] for m in modes]
            met = ""
            if figure.is_met is not None:
                met = " / ".join(f"{c.get('num_met', 0)} of {c['num_runs']}" for c in cells)
            lines.append(f"| {figure.label} | " + " | ".join(_cell(c) for c in cells)
                         + f" | {figure.target} | {met} |")
    errors = [r for r in document["runs"] if "error" in r]
    if errors:
        lines += ["", "Runs that failed to complete:"]
        lines += [f"- {r['scenario']} / {r['mode']} run {r['run']}: {r['error']}"
                  for r in errors]
    return "\n".join(lines)

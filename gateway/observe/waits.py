"""The "most expensive wait" report: where recent requests spent their time, per tier.

The gateway records each finished request's waits (``WAIT_TYPES``) in a rolling window;
``GET /admin/waits`` returns ``WaitsWindow.report()`` and ``switchyard waits`` prints it (or
saves it as a PNG with ``--png``, as bench runs do through ``save_png``). Each wait's *share* is
its part of the summed end-to-end latency; what no wait covers is the gateway's own work.

Example::

    window = WaitsWindow(window_s=300)
    window.record("batch", now_s, e2e_s=1.2, waits={"admission_queue": 0.9, "upstream_ttft": 0.2})
    report = window.report(now_s)
    report["tiers"]["batch"]["most_expensive"]["wait"]   # "admission_queue"
    print(render_text(report))
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections import deque
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

WAIT_TYPES = ("auth", "quota", "admission_queue", "routing", "upstream_connect",
              "upstream_ttft", "upstream_response", "streaming")
GATEWAY_WORK = "gateway"  # end-to-end time that no wait covers: parsing, tokenizing, relaying
# After the first token the request is being served, not waiting to be.
_SERVING = frozenset({"streaming", "upstream_response"})

MEANINGS = {
    "auth": "auth dominates: API-key lookups miss the gateway's cache and go to Redis — check "
            "Redis latency, or raise key_cache_ttl_s",
    "quota": "quota dominates: the per-request Redis quota script is slow — check Redis latency "
             "and load",
    "admission_queue": "admission queue dominates: requests wait in the gateway for fleet "
                       "capacity, the fleet is saturated for this tier — add workers or shed "
                       "batch",
    "routing": "routing dominates: tokenizing and scoring the fleet is slow — use the approximate "
               "tokenizer or a cheaper routing profile",
    "upstream_connect": "upstream connect dominates: connections to workers are slow to open or "
                        "the per-backend pool is exhausted — raise max_connections_per_backend "
                        "or check the network",
    "upstream_ttft": "worker queue / prefill dominates (time to first token): the workers are "
                     "saturated or prompts are long — add workers, route for prefix-cache hits, "
                     "or shed batch",
    "upstream_response": "worker response dominates (non-streaming: queue, prefill and decode "
                         "in the worker) — add workers or shorten outputs",
    "streaming": "streaming (decode) dominates: output length and time per token set latency — "
                 "expected for long outputs; if TPOT misses its SLO, add workers to shrink "
                 "batches",
    GATEWAY_WORK: "gateway work dominates: parsing, tokenizing and relaying in the gateway "
                  "itself — add gateway replicas",
}


class WaitsWindow:
    """Recent requests' waits, bounded by age (``window_s``) and count (``max_requests``)."""

    def __init__(self, window_s: float = 300.0, max_requests: int = 50_000) -> None:
        self.window_s = window_s
        self._records: deque[tuple[float, str, float, tuple[float, ...]]] = deque(
            maxlen=max_requests)

    def record(self, tier: str, now_s: float, e2e_s: float, waits: Mapping[str, float]) -> None:
        self._records.append((now_s, tier, e2e_s, tuple(waits.get(w, 0.0) for w in WAIT_TYPES)))

    def __len__(self) -> int:
        return len(self._records)

    def report(self, now_s: float, window_s: float | None = None) -> dict[str, Any]:
        window_s = self.window_s if window_s is None else min(window_s, self.window_s)
        while self._records and self._records[0][0] < now_s - self.window_s:
            self._records.popleft()
        recent = [r for r in self._records if r[0] >= now_s - window_s]
        by_tier: dict[str, list[tuple[float, tuple[float, ...]]]] = {"all": []}
        for _, tier, e2e_s, waits in recent:
            by_tier["all"].append((e2e_s, waits))
            by_tier.setdefault(tier, []).append((e2e_s, waits))
        return {"window_s": window_s, "num_requests": len(recent),
                "tiers": {tier: tier_report(rows) for tier, rows in by_tier.items()}}


def tier_report(rows: Sequence[tuple[float, tuple[float, ...]]]) -> dict[str, Any]:
    """Each wait's share of the summed latency and its p50 / p99; the most expensive named."""
    total_s = sum(e2e_s for e2e_s, _ in rows)
    columns: dict[str, list[float]] = {w: [waits[i] for _, waits in rows]
                                       for i, w in enumerate(WAIT_TYPES)}
    columns[GATEWAY_WORK] = [max(0.0, e2e_s - sum(waits)) for e2e_s, waits in rows]
    waits = {
        name: {"share": sum(values) / total_s if total_s > 0 else 0.0,
               "total_s": sum(values),
               "p50_ms": _percentile(values, 0.50) * 1e3,
               "p99_ms": _percentile(values, 0.99) * 1e3}
        for name, values in columns.items()
    }
    e2e = [e2e_s for e2e_s, _ in rows]
    report: dict[str, Any] = {
        "num_requests": len(rows), "total_latency_s": total_s,
        "e2e_p50_ms": _percentile(e2e, 0.50) * 1e3, "e2e_p99_ms": _percentile(e2e, 0.99) * 1e3,
        "waits": waits, "most_expensive": _most_expensive(waits, exclude=frozenset()),
    }
    if report["most_expensive"] and report["most_expensive"]["wait"] in _SERVING:
        report["most_expensive_before_first_token"] = _most_expensive(waits, exclude=_SERVING)
    return report


def _most_expensive(waits: Mapping[str, Mapping[str, float]],
                    exclude: frozenset[str]) -> dict[str, Any] | None:
    candidates = [(figures["share"], name) for name, figures in waits.items()
                  if name not in exclude and figures["share"] > 0]
    if not candidates:
        return None
    share, name = max(candidates)
    return {"wait": name, "share": share, "meaning": MEANINGS[name]}


def _percentile(values: Sequence[float], fraction: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    position = fraction * (len(ordered) - 1)
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


# -- rendering --------------------------------------------------------------------------------
def render_text(report: Mapping[str, Any]) -> str:
    lines = [f"waits over the last {report['window_s']:g} s ({report['num_requests']} requests)"]
    for tier, figures in report["tiers"].items():
        lines += ["", f"tier {tier}: {figures['num_requests']} requests, e2e p50 "
                  f"{figures['e2e_p50_ms']:.1f} ms, p99 {figures['e2e_p99_ms']:.1f} ms",
                  f"  {'wait':<18} {'share':>7} {'p50 ms':>10} {'p99 ms':>10}"]
        ranked = sorted(figures["waits"].items(), key=lambda item: -item[1]["share"])
        for name, wait in ranked:
            lines.append(f"  {name:<18} {wait['share']:>7.1%} {wait['p50_ms']:>10.2f} "
                         f"{wait['p99_ms']:>10.2f}")
        for key, label in (("most_expensive", "most expensive"),
                           ("most_expensive_before_first_token", "before the first token")):
            top = figures.get(key)
            if top:
                lines.append(f"  {label}: {top['wait']} ({top['share']:.0%}) — {top['meaning']}")
    return "\n".join(lines)


def save_png(report: Mapping[str, Any], path: str | Path, title: str | None = None) -> Path:
    """The breakdown as one stacked bar per tier (share of latency by wait): for bench runs."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tiers = list(report["tiers"])
    names = [*WAIT_TYPES, GATEWAY_WORK]
    fig, ax = plt.subplots(figsize=(9, 1.2 + 0.6 * len(tiers)))
    lefts = [0.0] * len(tiers)
    colors = plt.get_cmap("tab10")
    for index, name in enumerate(names):
        shares = [report["tiers"][t]["waits"][name]["share"] * 100 for t in tiers]
        if not any(shares):
            continue
        ax.barh(tiers, shares, left=lefts, label=name, color=colors(index % 10))
        lefts = [left + share for left, share in zip(lefts, shares, strict=True)]
    ax.set_xlabel("share of end-to-end latency (%)")
    ax.set_xlim(0, 100)
    ax.invert_yaxis()
    ax.set_title(title or f"where requests waited (last {report['window_s']:g} s, "
                 f"{report['num_requests']} requests)")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.35), ncol=5, fontsize="small")
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return out


# -- `switchyard waits` -----------------------------------------------------------------------
def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from gateway.cli.admin_client import add_admin_arguments

    parser = sub.add_parser("waits", help="which wait dominates, per tier (GET /admin/waits)")
    parser.add_argument("--window-s", type=float, help="look at the last N seconds only")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--png", type=Path, help="also save the breakdown as a PNG")
    add_admin_arguments(parser)


def fetch(url: str, admin_token: str, window_s: float | None = None) -> dict[str, Any]:
    import httpx

    params = {"window_s": str(window_s)} if window_s is not None else None
    response = httpx.get(url.rstrip("/") + "/admin/waits", params=params, timeout=10.0,
                         headers={"Authorization": f"Bearer {admin_token}"})
    data: dict[str, Any] = response.json() if response.content else {}
    if response.status_code >= 400:
        message = data.get("error", {}).get("message", response.text)
        raise RuntimeError(f"error ({response.status_code}): {message}")
    return data


def run(args: argparse.Namespace) -> int:
    import httpx

    token = args.admin_token or os.environ.get("SWITCHYARD_ADMIN_TOKEN")
    if not token:
        print("error: pass --admin-token or set SWITCHYARD_ADMIN_TOKEN", file=sys.stderr)
        return 2
    try:
        report = fetch(args.url, token, args.window_s)
    except httpx.HTTPError as exc:
        print(f"error: cannot reach the gateway at {args.url}: {exc}", file=sys.stderr)
        return 1
    except RuntimeError as failed:
        print(failed, file=sys.stderr)
        return 1
    if args.json:
        import json

        print(json.dumps(report, indent=2))
    else:
        print(render_text(report))
    if args.png:
        if not report.get("num_requests"):
            print(f"no chart saved: the gateway saw no requests in the last "
                  f"{report.get('window_s', 0):g} s; send some and run it again",
                  file=sys.stderr)
        else:
            print(f"saved {save_png(report, args.png)}", file=sys.stderr)
    return 0

"""The figures of one admission-benchmark run, from its records: pure functions, no I/O.

Per tier: SLO attainment of the *offered* requests (a first token within the tier's TTFT SLO)
and of the *admitted* ones, goodput, TTFT p50/p99, and what happened to the rest. Across
tenants: each tenant's normalised service (tokens served / tokens demanded), Jain's index over
the equal-weight tenants, and the heavy tenant's service against its max-min fair share.

Definitions (also in docs/benchmarks.md):

- *rejected*: answered 429 or 503 by the gateway; *unresolved*: still waiting, with no first
  token, when the run was cut off at the end of its drain;
- *admitted*: with admission on, every request that got a first token or an answer; with
  admission off (plain FIFO) every request that was not rejected, since the gateway lets
  everything through and the unresolved ones sat in the workers' queues;
- *goodput*: requests that met their tier's SLO with their first token inside the send window,
  per second of that window (so a backlog served during the drain does not count);
- *longest gap*: a tier's longest stretch of the send window (from its first request on) with
  no first token of it: how close the tier came to starving;
- *retries* (`retry_figures`): of the first retries of refused requests, the share admitted
  (not refused again, and not still waiting with no first token at the cut-off) and the share
  with a first token within the tier's TTFT SLO, timed from the retry's own send.

Example::

    figures = run_figures(records, DEFAULT_SLOS, demanded, window_s=40.0, is_fifo=False,
                          heavy="t0")
    figures["tiers"]["interactive"]["attainment_offered"]
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from bench.common.stats import percentile
from bench.run.options import Slo
from bench.run.spec import Record
from bench.run.summary import error_kind, meets_slo

REJECTED_STATUSES = (429, 503)


def jain(values: Sequence[float]) -> float | None:
    """Jain's fairness index (sum x)^2 / (n * sum x^2): 1 when all are equal, 1/n when one
    gets everything; None for no values or all zero."""
    total_sq = sum(v * v for v in values)
    if not values or total_sq == 0:
        return None
    return sum(values) ** 2 / (len(values) * total_sq)


def max_min_shares(demands: Mapping[str, float], total: float,
                   weights: Mapping[str, float] | None = None) -> dict[str, float]:
    """Weighted water-filling: each tenant gets its demand or ``weight`` times the level left,
    whichever is smaller, until ``total`` is spent (missing weights: 1). Example: demands
    {a: 1, b: 10}, total 4 -> a 1, b 3; the same with weights {b: 3}, total 2 -> a 0.5, b 1.5."""
    def weight(name: str) -> float:
        return (weights or {}).get(name, 1.0)

    shares = dict.fromkeys(demands, 0.0)
    left = total
    # Tenants leave the pool in order of demand per unit of weight: the first to be satisfied.
    pending = sorted(demands, key=lambda name: demands[name] / weight(name))
    while pending and left > 1e-12:
        level = left / sum(weight(name) for name in pending)
        name = pending[0]
        if demands[name] <= level * weight(name):
            shares[name] = demands[name]
            left -= demands[name]
            pending.pop(0)
            continue
        for other in pending:
            shares[other] = level * weight(other)
        left = 0.0
    return shares


def weighted_jain(values: Sequence[tuple[float, float]]) -> float | None:
    """Jain's index of values each with a weight (value, weight): (sum w x)^2 / (sum w *
    sum w x^2); 1 when all are equal, the plain index when the weights are."""
    total_w = sum(w for _, w in values)
    total_sq = sum(w * x * x for x, w in values)
    if not values or total_w <= 0 or total_sq == 0:
        return None
    return sum(w * x for x, w in values) ** 2 / (total_w * total_sq)


def is_rejected(record: Record) -> bool:
    return record.status in REJECTED_STATUSES


def is_unresolved(record: Record) -> bool:
    return record.status == -1 and record.ttft_s is None


def is_admitted(record: Record, is_fifo: bool) -> bool:
    if is_rejected(record):
        return False
    return is_fifo or not is_unresolved(record)


def _first_token_at_s(record: Record) -> float | None:
    first_s = record.ttft_s if record.ttft_s is not None else (
        record.e2e_s if record.is_ok else None)
    return None if first_s is None else record.sent_at_s + first_s


def is_good_in_window(record: Record, slo: Slo | None, window_s: float) -> bool:
    at_s = _first_token_at_s(record)
    return meets_slo(record, slo) and at_s is not None and at_s <= window_s


def _ms(values: Sequence[float]) -> dict[str, float | int | None]:
    return {"p50": percentile(values, 0.5) * 1000 if values else None,
            "p99": percentile(values, 0.99) * 1000 if values else None, "num": len(values)}


def _share(part: int, whole: int) -> float | None:
    return part / whole if whole else None


def _resolved_at_s(record: Record) -> float:
    """When the client knew the outcome: first token, or the whole answer (a 503 included)."""
    first_s = record.ttft_s if record.ttft_s is not None else record.e2e_s
    return math.inf if first_s is None else record.sent_at_s + first_s


def num_rejected_while_pending(records: Sequence[Record]) -> int:
    """Rejections that arrived while another request of the same set (a tier) was still
    waiting for its first token: how often the gateway refused a request because another one
    already held the place it would have waited in."""
    pending = sorted(records, key=lambda r: r.sent_at_s)
    count = 0
    for index, record in enumerate(pending):
        if is_rejected(record) and any(_resolved_at_s(other) > record.sent_at_s
                                       for other in pending[:index]):
            count += 1
    return count


def late_admitted(records: Sequence[Record], slo: Slo | None, is_fifo: bool
                  ) -> dict[str, float | int | None]:
    """Admitted requests whose first token came after the SLO, and how late (ms)."""
    late = [r.ttft_s for r in records if is_admitted(r, is_fifo) and r.ttft_s is not None
            and slo is not None and r.ttft_s > slo.ttft_s]
    return {"num": len(late), "min_ttft_ms": min(late) * 1000 if late else None,
            "max_ttft_ms": max(late) * 1000 if late else None}


def longest_gap_s(records: Sequence[Record], window_s: float) -> float | None:
    """The longest stretch of ``[first request, window_s]`` without a first token of
    ``records``; None for no requests in the window."""
    starts = [r.sent_at_s for r in records if r.sent_at_s <= window_s]
    if not starts:
        return None
    firsts = sorted(at for r in records if r.is_ok
                    and (at := _first_token_at_s(r)) is not None and at <= window_s)
    edges = [min(starts), *firsts, window_s]
    return max(later - earlier for earlier, later in itertools.pairwise(edges))


def tier_figures(records: Sequence[Record], slo: Slo | None, window_s: float,
                 is_fifo: bool) -> dict[str, Any]:
    """The figures of one tier (or of all requests, with ``slo`` None meaning each its own)."""
    num_met = sum(meets_slo(r, slo) for r in records)
    admitted = [r for r in records if is_admitted(r, is_fifo)]
    num_good = sum(is_good_in_window(r, slo, window_s) for r in records)
    return {
        "num_offered": len(records),
        "num_admitted": len(admitted),
        "num_rejected": sum(is_rejected(r) for r in records),
        "num_unresolved": sum(is_unresolved(r) for r in records),
        "num_ok": sum(r.is_ok for r in records),
        "num_met_slo": num_met,
        "attainment_offered": _share(num_met, len(records)),
        "attainment_admitted": _share(sum(meets_slo(r, slo) for r in admitted), len(admitted)),
        "offered_rps": len(records) / window_s,
        "goodput_rps": num_good / window_s,
        "ttft_ms": _ms([r.ttft_s for r in records if r.is_ok and r.ttft_s is not None]),
        "statuses": dict(Counter("200" if r.is_ok else error_kind(r) for r in records)),
        "num_rejected_while_pending": num_rejected_while_pending(records),
        "late_admitted": late_admitted(records, slo, is_fifo),
        "longest_gap_s": longest_gap_s(records, window_s),
        "num_first_tokens_in_window": sum(r.is_ok and (at := _first_token_at_s(r)) is not None
                                          and at <= window_s for r in records),
    }


def fairness(records: Sequence[Record], demanded_tokens: Mapping[int, int],
             heavy: str, weights: Mapping[str, float] | None = None) -> dict[str, Any]:
    """Service per tenant in tokens (the request's prompt plus max_tokens, as planned, counted
    as served when the request was answered in full); Jain's index over the tenants other
    than ``heavy`` (equal weights, equal demand); the (``weights``-weighted) max-min fair
    variant over all of them."""
    demanded: Counter[str] = Counter()
    served: Counter[str] = Counter()
    for r in records:
        demanded[r.tenant] += demanded_tokens[r.index]
        if r.is_ok:
            served[r.tenant] += demanded_tokens[r.index]
    tenants = sorted(demanded)
    normalised = {t: served[t] / demanded[t] for t in tenants}
    light = [normalised[t] for t in tenants if t != heavy]
    shares = max_min_shares({t: float(demanded[t]) for t in tenants},
                            float(sum(served.values())), weights)
    to_fair = {t: served[t] / shares[t] for t in tenants if shares[t] > 0}
    return {
        "jain_equal_weight": jain(light),
        "normalised_service": normalised,
        "heavy_normalised_service": normalised.get(heavy),
        "light_normalised_service_mean": sum(light) / len(light) if light else None,
        "heavy_service_over_max_min_share": to_fair.get(heavy),
        "jain_max_min": jain(list(to_fair.values())),
        "to_max_min_share": to_fair,
        "max_min_share_tokens": shares,
        "tokens_demanded": dict(demanded),
        "tokens_served": dict(served),
    }


def jain_within_tiers(by_tier: Mapping[str, Mapping[str, Any]]) -> float | None:
    """Jain's index of every (tenant, tier)'s service against its weighted max-min share
    within its tier, each weighted by that share: fairness as the gateway promises it (strict
    priority across tiers, weighted fair shares within one). Across tiers the max-min shares
    contradict the tiers: the heavy tenant's interactive traffic alone, all of it served as
    the interactive target asks, is twice its max-min share of the whole fleet at 2x."""
    values = [(float(tier["to_max_min_share"][t]), float(share))
              for tier in by_tier.values()
              for t, share in tier["max_min_share_tokens"].items() if share > 0]
    return weighted_jain(values)


def run_figures(records: Sequence[Record], slos: Mapping[str, Slo],
                demanded_tokens: Mapping[int, int], *, window_s: float, is_fifo: bool,
                heavy: str, weights: Mapping[str, float] | None = None) -> dict[str, Any]:
    """Every figure of one run: per tier, overall and fairness."""
    tiers = {tier: tier_figures([r for r in records if r.tier == tier], slo, window_s, is_fifo)
             for tier, slo in slos.items()}
    overall_good = sum(t["goodput_rps"] for t in tiers.values())
    by_tier = {tier: fairness([r for r in records if r.tier == tier], demanded_tokens, heavy,
                              weights) for tier in slos
               if any(r.tier == tier for r in records)}
    return {
        "tiers": tiers,
        "offered_rps": len(records) / window_s,
        "goodput_rps": overall_good,
        "throughput_rps": sum(r.is_ok for r in records) / window_s,
        "statuses": dict(Counter("200" if r.is_ok else error_kind(r) for r in records)),
        "fairness": fairness(records, demanded_tokens, heavy, weights),
        # Tiers are served in strict priority, so fairness across tenants is a promise within
        # a tier: the same figures for each tier's requests alone.
        "fairness_by_tier": by_tier,
        "jain_max_min_within_tiers": jain_within_tiers(by_tier),
        "max_lag_ms": max((r.lag_s for r in records), default=0.0) * 1000,
    }


def retry_figures(first: Sequence[Record], retries: Mapping[int, Record],
                  slos: Mapping[str, Slo], retrying_tiers: Sequence[str]) -> dict[str, Any]:
    """The first retries of refused requests, over all ``retrying_tiers`` and per tier: how
    many refusals there were, how many were retried, and of the retries the share admitted
    and the share within the tier's TTFT SLO; how late each left against its Retry-After."""

    def figures(tiers: Sequence[str]) -> dict[str, Any]:
        refused = [r for r in first if r.tier in tiers and is_rejected(r)]
        tried = [retries[r.index] for r in refused if r.index in retries]
        num_admitted = sum(is_admitted(r, is_fifo=False) for r in tried)
        num_met = sum(meets_slo(r, slos.get(r.tier)) for r in tried)
        lags_s = [r.lag_s for r in tried if r.e2e_s is not None]  # sent and answered
        waits_s = [r.retry_after_s for r in refused if r.retry_after_s is not None]
        return {
            "num_refused": len(refused),
            "num_with_retry_after": len(waits_s),
            "num_retried": len(tried),
            "num_admitted": num_admitted,
            "num_refused_again": sum(is_rejected(r) for r in tried),
            "num_unresolved": sum(is_unresolved(r) for r in tried),
            "num_met_slo": num_met,
            "admitted_share": _share(num_admitted, len(tried)),
            "met_slo_share": _share(num_met, len(tried)),
            "retry_after_s": {"min": min(waits_s, default=None),
                              "max": max(waits_s, default=None)},
            "lag_ms_max": max(lags_s) * 1000 if lags_s else None,
            "ttft_ms": _ms([r.ttft_s for r in tried if r.is_ok and r.ttft_s is not None]),
        }

    return {"tiers": list(retrying_tiers), **figures(retrying_tiers),
            "by_tier": {tier: figures([tier]) for tier in retrying_tiers}}

"""The admission benchmark's new figures on hand-made records: how long a tier went without a
first token, and what became of the retries of refused requests."""

from __future__ import annotations

import pytest

from bench.admission.figures import (
    longest_gap_s,
    max_min_shares,
    retry_figures,
    run_figures,
    weighted_jain,
)
from bench.run.options import DEFAULT_SLOS
from bench.run.spec import Record


def record(index: int, sent_at_s: float, status: int = 200, ttft_s: float | None = 0.1,
           tier: str = "interactive", retry_after_s: float | None = None,
           lag_s: float = 0.0) -> Record:
    is_ok = status == 200
    return Record(index=index, tenant="t1", tier=tier, phase=0, is_stream=True,
                  sent_at_s=sent_at_s, lag_s=lag_s, status=status,
                  ttft_s=ttft_s if is_ok else None, e2e_s=(ttft_s or 0.0) + 0.1,
                  retry_after_s=retry_after_s)


@pytest.mark.parametrize(("records", "window_s", "expected"), [
    pytest.param([], 10.0, None, id="no-requests"),
    pytest.param([record(0, 1.0, ttft_s=1.0)], 10.0, 8.0, id="one-then-nothing"),
    pytest.param([record(0, 0.0, ttft_s=1.0), record(1, 4.0, ttft_s=1.0),
                  record(2, 6.0, ttft_s=1.0)], 8.0, 4.0, id="between-first-tokens"),
    pytest.param([record(0, 2.0, status=503), record(1, 3.0, status=503)], 10.0, 8.0,
                 id="all-refused-from-the-first-request"),
    pytest.param([record(0, 0.0, ttft_s=12.0)], 10.0, 10.0, id="first-token-after-the-window"),
])
def test_longest_gap_s(records: list[Record], window_s: float, expected: float | None) -> None:
    assert longest_gap_s(records, window_s) == expected


def test_retry_figures() -> None:
    first = [record(0, 0.0, status=503, retry_after_s=1.0),
             record(1, 0.5, status=503, retry_after_s=2.0),
             record(2, 0.6, status=429, retry_after_s=1.0, tier="standard"),
             record(3, 0.7, status=503, retry_after_s=30.0),  # over the wait cap: not retried
             record(4, 0.8),  # admitted at once
             record(5, 0.9, status=503, retry_after_s=1.0, tier="standard")]
    retries = {0: record(0, 1.1, ttft_s=0.2, lag_s=0.002),  # admitted, in SLO (0.5 s)
               1: record(1, 2.6, ttft_s=0.9, lag_s=0.001),  # admitted, late
               2: record(2, 1.7, status=503, retry_after_s=1.0, tier="standard"),
               5: record(5, 2.0, status=-1, ttft_s=None, tier="standard")}  # cut off, waiting
    figures = retry_figures(first, retries, DEFAULT_SLOS, ("interactive", "standard"))
    assert (figures["num_refused"], figures["num_with_retry_after"],
            figures["num_retried"]) == (5, 5, 4)
    assert (figures["num_admitted"], figures["num_refused_again"],
            figures["num_unresolved"], figures["num_met_slo"]) == (2, 1, 1, 1)
    assert figures["admitted_share"] == 0.5 and figures["met_slo_share"] == 0.25
    assert figures["retry_after_s"] == {"min": 1.0, "max": 30.0}
    assert figures["lag_ms_max"] == pytest.approx(2.0)
    interactive, standard = figures["by_tier"]["interactive"], figures["by_tier"]["standard"]
    assert (interactive["num_retried"], interactive["admitted_share"]) == (2, 1.0)
    assert (standard["num_retried"], standard["admitted_share"]) == (2, 0.0)


def test_retry_figures_without_refusals() -> None:
    figures = retry_figures([record(0, 0.0)], {}, DEFAULT_SLOS, ("interactive",))
    assert figures["num_retried"] == 0
    assert figures["admitted_share"] is None and figures["met_slo_share"] is None


@pytest.mark.parametrize(("demands", "total", "weights", "expected"), [
    pytest.param({"a": 1.0, "b": 10.0}, 4.0, None, {"a": 1.0, "b": 3.0}, id="unweighted"),
    pytest.param({"a": 1.0, "b": 10.0}, 2.0, {"b": 3.0}, {"a": 0.5, "b": 1.5},
                 id="both-capped-by-weight"),
    pytest.param({"a": 1.0, "b": 10.0, "c": 10.0}, 9.0, {"c": 2.0},
                 {"a": 1.0, "b": 8.0 / 3, "c": 16.0 / 3}, id="a-satisfied-the-rest-by-weight"),
    pytest.param({"a": 1.0, "b": 2.0}, 5.0, {"a": 9.0}, {"a": 1.0, "b": 2.0},
                 id="all-satisfied"),
])
def test_weighted_max_min_shares(demands: dict[str, float], total: float,
                                 weights: dict[str, float] | None,
                                 expected: dict[str, float]) -> None:
    assert max_min_shares(demands, total, weights) == pytest.approx(expected)


def test_weighted_jain() -> None:
    assert weighted_jain([(1.0, 5.0), (1.0, 1.0)]) == pytest.approx(1.0)
    assert weighted_jain([(2.0, 1.0), (0.0, 1.0)]) == pytest.approx(0.5)  # the plain index
    # a small share far off its fair value weighs little
    assert weighted_jain([(1.0, 99.0), (0.0, 1.0)]) == pytest.approx(0.99)
    assert weighted_jain([]) is None


def test_fairness_within_tiers_judges_each_tier_by_its_own_shares() -> None:
    """Heavy t0 gets all its interactive traffic (more than its share of the whole fleet) and
    an equal share of standard with t1: fair within each tier, not across them."""
    demanded = {0: 100, 1: 100, 2: 100, 3: 100, 4: 100, 5: 100}
    records = [Record(index=i, tenant=tenant, tier=tier, phase=0, is_stream=True,
                      sent_at_s=0.0, lag_s=0.0, status=status, ttft_s=0.1, e2e_s=0.2)
               for i, (tenant, tier, status) in enumerate([
                   ("t0", "interactive", 200), ("t0", "interactive", 200),
                   ("t0", "interactive", 200), ("t0", "standard", 200),
                   ("t1", "standard", 200), ("t1", "standard", 503)])]
    figures = run_figures(records, DEFAULT_SLOS, demanded, window_s=10.0, is_fifo=False,
                          heavy="t0")
    assert figures["jain_max_min_within_tiers"] == pytest.approx(1.0)
    assert figures["fairness"]["jain_max_min"] < 0.95  # across tiers t0 looks favoured
    unfair = [Record(index=r.index, tenant=r.tenant, tier=r.tier, phase=0, is_stream=True,
                     sent_at_s=0.0, lag_s=0.0, status=503 if r.index == 4 else r.status,
                     ttft_s=0.1, e2e_s=0.2) for r in records]  # standard: t0 over t1
    figures = run_figures(unfair, DEFAULT_SLOS, demanded, window_s=10.0, is_fifo=False,
                          heavy="t0")
    assert figures["jain_max_min_within_tiers"] < 0.95

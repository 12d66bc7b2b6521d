"""The admission benchmark's new figures on hand-made records: how long a tier went without a
first token, and what became of the retries of refused requests."""

from __future__ import annotations

import pytest

from bench.admission_bench_figures import longest_gap_s, retry_figures
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

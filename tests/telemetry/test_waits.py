"""The waits report on hand-built windows: shares, percentiles, the most expensive wait."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.observe.waits import MEANINGS, WaitsWindow, render_text, save_png

# (tier, e2e_s, waits) per request
Rows = list[tuple[str, float, dict[str, float]]]

SATURATED: Rows = [("batch", 1.0, {"admission_queue": 0.8, "upstream_response": 0.15})] * 5
SLOW_WORKER: Rows = [("standard", 0.5, {"upstream_ttft": 0.4, "streaming": 0.05,
                                        "routing": 0.001})] * 5
LONG_OUTPUTS: Rows = [("standard", 2.0, {"upstream_ttft": 0.1, "streaming": 1.85,
                                         "quota": 0.01})] * 3
GATEWAY_BOUND: Rows = [("interactive", 0.01, {"auth": 0.001, "upstream_response": 0.002})]


@pytest.mark.parametrize(("rows", "tier", "expected", "before_first_token"), [
    pytest.param(SATURATED, "batch", "admission_queue", None, id="saturated-queue"),
    pytest.param(SLOW_WORKER, "standard", "upstream_ttft", None, id="slow-worker"),
    pytest.param(LONG_OUTPUTS, "standard", "streaming", "upstream_ttft", id="long-outputs"),
    pytest.param(GATEWAY_BOUND, "interactive", "gateway", None, id="gateway-work"),
    pytest.param(SATURATED + SLOW_WORKER, "all", "admission_queue", None, id="overall"),
])
def test_most_expensive_wait(rows: Rows, tier: str, expected: str,
                             before_first_token: str | None) -> None:
    window = WaitsWindow()
    for index, (row_tier, e2e_s, waits) in enumerate(rows):
        window.record(row_tier, float(index), e2e_s, waits)
    report = window.report(now_s=float(len(rows)))
    figures = report["tiers"][tier]
    assert figures["most_expensive"]["wait"] == expected
    assert figures["most_expensive"]["meaning"] == MEANINGS[expected]
    assert sum(w["share"] for w in figures["waits"].values()) == pytest.approx(1.0)
    second = figures.get("most_expensive_before_first_token")
    assert (second["wait"] if second else None) == before_first_token


def test_shares_and_percentiles() -> None:
    window = WaitsWindow()
    for index, queue_s in enumerate([0.0, 0.1, 0.2, 0.3, 0.4]):
        window.record("batch", float(index), 1.0, {"admission_queue": queue_s})
    figures = window.report(now_s=5.0)["tiers"]["batch"]
    queue = figures["waits"]["admission_queue"]
    assert queue["share"] == pytest.approx(1.0 / 5)  # 1.0 s of 5.0 s
    assert queue["p50_ms"] == pytest.approx(200.0)
    assert queue["p99_ms"] == pytest.approx(396.0)
    assert figures["waits"]["gateway"]["share"] == pytest.approx(4.0 / 5)
    assert figures["e2e_p50_ms"] == pytest.approx(1000.0)


def test_old_requests_leave_the_window() -> None:
    window = WaitsWindow(window_s=10.0)
    window.record("batch", 0.0, 1.0, {"admission_queue": 0.9})
    window.record("standard", 8.0, 1.0, {"upstream_ttft": 0.9})
    assert set(window.report(now_s=9.0)["tiers"]) == {"all", "batch", "standard"}
    assert window.report(now_s=9.0, window_s=5.0)["num_requests"] == 1
    report = window.report(now_s=15.0)
    assert set(report["tiers"]) == {"all", "standard"}
    assert len(window) == 1


def test_empty_window() -> None:
    report = WaitsWindow().report(now_s=0.0)
    assert report["num_requests"] == 0
    assert report["tiers"]["all"]["most_expensive"] is None
    assert "0 requests" in render_text(report)


def test_text_and_png(tmp_path: Path) -> None:
    window = WaitsWindow()
    for index, (tier, e2e_s, waits) in enumerate(SATURATED + SLOW_WORKER):
        window.record(tier, float(index), e2e_s, waits)
    report = window.report(now_s=10.0)
    text = render_text(report)
    assert "tier batch: 5 requests" in text
    assert "most expensive: admission_queue (80%)" in text
    path = save_png(report, tmp_path / "waits.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

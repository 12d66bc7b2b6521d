"""Quota value types: OpenAI's duration format, headers, status codes and messages."""

from __future__ import annotations

import pytest

from admission.quota.types import QuotaDecision, format_duration_ms


@pytest.mark.parametrize(("duration_ms", "text"), [
    pytest.param(0, "0s", id="zero"),
    pytest.param(-5, "0s", id="negative"),
    pytest.param(20, "20ms", id="millis"),
    pytest.param(999, "999ms", id="just-under-a-second"),
    pytest.param(1000, "1s", id="second"),
    pytest.param(1500, "1.5s", id="fraction"),
    pytest.param(17_280, "17.28s", id="two-decimals"),
    pytest.param(360_000, "6m0s", id="minutes"),
    pytest.param(90_001, "1m30.001s", id="minutes-and-millis"),
    pytest.param(3_723_400, "1h2m3.4s", id="hours"),
])
def test_format_duration_ms(duration_ms: int, text: str) -> None:
    assert format_duration_ms(duration_ms) == text


ALLOWED = QuotaDecision(is_allowed=True, limit_requests=60, remaining_requests=59,
                        reset_requests_ms=1000, limit_tokens=90_000, remaining_tokens=89_000,
                        reset_tokens_ms=667)
REFUSED = QuotaDecision(is_allowed=False, refused_by="requests", retry_after_ms=1200,
                        limit_requests=60, remaining_requests=0, reset_requests_ms=60_000)


@pytest.mark.parametrize(("decision", "headers"), [
    pytest.param(ALLOWED, {
        "x-ratelimit-limit-requests": "60", "x-ratelimit-remaining-requests": "59",
        "x-ratelimit-reset-requests": "1s", "x-ratelimit-limit-tokens": "90000",
        "x-ratelimit-remaining-tokens": "89000", "x-ratelimit-reset-tokens": "667ms",
    }, id="allowed-both-limits"),
    pytest.param(REFUSED, {
        "x-ratelimit-limit-requests": "60", "x-ratelimit-remaining-requests": "0",
        "x-ratelimit-reset-requests": "1m0s", "retry-after": "2", "retry-after-ms": "1200",
    }, id="refused-requests-only"),
    pytest.param(QuotaDecision(is_allowed=False, refused_by="unavailable"), {},
                 id="unavailable"),
    pytest.param(QuotaDecision(is_allowed=False, refused_by="unavailable", retry_after_ms=1000),
                 {"retry-after": "1", "retry-after-ms": "1000"}, id="unavailable-fail-closed"),
])
def test_headers(decision: QuotaDecision, headers: dict[str, str]) -> None:
    assert decision.headers() == headers


@pytest.mark.parametrize(("decision", "status", "phrase"), [
    pytest.param(ALLOWED, 200, "Allowed", id="allowed"),
    pytest.param(REFUSED, 429, "try again in 1.2s", id="requests"),
    pytest.param(QuotaDecision(is_allowed=False, refused_by="too_large", limit_tokens=100,
                               requested_tokens=500), 429, "requested 500", id="too-large"),
    pytest.param(QuotaDecision(is_allowed=False, refused_by="unavailable"), 503, "unavailable",
                 id="unavailable"),
])
def test_status_and_message(decision: QuotaDecision, status: int, phrase: str) -> None:
    assert decision.http_status == status
    assert phrase in decision.message()


def test_retry_after_s_rounds_up_to_a_whole_second() -> None:
    assert QuotaDecision(is_allowed=False, retry_after_ms=1).retry_after_s == 1
    assert QuotaDecision(is_allowed=False, retry_after_ms=2001).retry_after_s == 3
    assert QuotaDecision(is_allowed=True).retry_after_s is None

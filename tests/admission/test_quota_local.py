"""The in-process fallback limiter, on a hand-driven clock: same semantics as the Lua scripts."""

from __future__ import annotations

from admission.quota.local import LocalLimiter
from admission.quota.types import QuotaLimits


def test_request_burst_is_exact_then_paced() -> None:
    local, limits = LocalLimiter(lease_ttl_s=60), QuotaLimits(requests_per_minute=4)
    admitted = [local.acquire("t", limits, tokens=0, request_id=f"r{i}", now_s=100.0).is_allowed
                for i in range(5)]
    assert admitted == [True] * 4 + [False]
    refused = local.acquire("t", limits, tokens=0, request_id="x", now_s=100.0)
    assert refused.refused_by == "requests" and refused.retry_after_ms == 15_000
    assert refused.is_local
    assert not local.acquire("t", limits, tokens=0, request_id="y", now_s=114.9).is_allowed
    assert local.acquire("t", limits, tokens=0, request_id="z", now_s=115.0).is_allowed


def test_tokens_settle_refunds_and_charges_overrun() -> None:
    local, limits = LocalLimiter(lease_ttl_s=60), QuotaLimits(tokens_per_minute=600)
    assert local.acquire("t", limits, tokens=500, request_id="a", now_s=0.0).is_allowed
    assert local.acquire("t", limits, tokens=200, request_id="b", now_s=0.0).refused_by == "tokens"
    local.settle("t", limits, reserved_tokens=500, actual_tokens=100, request_id="a", now_s=0.0)
    assert local.acquire("t", limits, tokens=500, request_id="c", now_s=0.0).remaining_tokens == 0
    local.settle("t", limits, reserved_tokens=500, actual_tokens=560, request_id="c", now_s=0.0)
    refused = local.acquire("t", limits, tokens=1, request_id="d", now_s=0.0)
    assert refused.refused_by == "tokens" and refused.retry_after_ms == 6_100
    too_large = local.acquire("t", limits, tokens=601, request_id="e", now_s=0.0)
    assert too_large.refused_by == "too_large" and too_large.retry_after_ms is None


def test_leases_release_renew_and_expire() -> None:
    local, limits = LocalLimiter(lease_ttl_s=1.0), QuotaLimits(max_concurrent=1)
    assert local.acquire("t", limits, tokens=0, request_id="a", now_s=0.0).is_allowed
    refused = local.acquire("t", limits, tokens=0, request_id="b", now_s=0.5)
    assert refused.refused_by == "concurrency" and refused.retry_after_ms == 500
    assert local.renew("a", now_s=0.9)
    assert not local.acquire("t", limits, tokens=0, request_id="b", now_s=1.5).is_allowed
    assert local.acquire("t", limits, tokens=0, request_id="b", now_s=1.9).is_allowed  # expired
    assert not local.renew("a", now_s=2.0) and not local.holds("a")
    assert local.settle("t", limits, reserved_tokens=0, actual_tokens=0, request_id="b",
                        now_s=2.0)
    assert local.acquire("t", limits, tokens=0, request_id="c", now_s=2.0).is_allowed

"""The in-process quota store of a single replica, on a hand-driven clock."""

from __future__ import annotations

from admission.quota.memory import MemoryQuotaStore
from admission.quota.types import QuotaLimits


class Clock:
    def __init__(self) -> None:
        self.now_s = 100.0

    def __call__(self) -> float:
        return self.now_s


async def test_requests_per_minute_are_exact_and_counted() -> None:
    clock = Clock()
    store, limits = MemoryQuotaStore(clock=clock), QuotaLimits(requests_per_minute=2)
    decisions = [await store.acquire("t", limits, tokens=1, request_id=f"r{i}")
                 for i in range(3)]
    assert [d.is_allowed for d in decisions] == [True, True, False]
    assert decisions[2].http_status == 429 and decisions[2].retry_after_ms == 30_000
    clock.now_s += 30
    assert (await store.acquire("t", limits, tokens=1, request_id="r4")).is_allowed
    assert store.counters()["num_acquires"] == 4 and store.counters()["num_refused"] == 1
    assert not store.is_redis_down and store.num_script_loads == 0


async def test_leases_are_released_by_settle_soon_and_kept_by_renew() -> None:
    clock = Clock()
    store, limits = MemoryQuotaStore(lease_ttl_s=1.0, clock=clock), QuotaLimits(max_concurrent=1)
    assert (await store.acquire("t", limits, tokens=0, request_id="a")).is_allowed
    assert not (await store.acquire("t", limits, tokens=0, request_id="b")).is_allowed
    clock.now_s += 0.9
    assert await store.renew("t", "a")
    clock.now_s += 0.9
    assert not (await store.acquire("t", limits, tokens=0, request_id="b")).is_allowed
    store.settle_soon("t", limits, reserved_tokens=0, actual_tokens=0, request_id="a")
    assert (await store.acquire("t", limits, tokens=0, request_id="b")).is_allowed
    assert await store.settle("t", limits, reserved_tokens=0, actual_tokens=0, request_id="b")
    await store.aclose()

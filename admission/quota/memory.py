"""Tenant quotas of a single gateway replica, in process: the quota store without Redis.

The same algorithm as the Redis scripts (``admission.quota.local.LocalLimiter``: a GCRA per
tenant for requests and for tokens, leases with a TTL for concurrency), and the interface the
gateway uses of ``admission.quota.store.QuotaStore``. With one replica it sees all the traffic,
so its limits are exact; nothing is shared, so several replicas would each enforce the full
limits.

Example::

    store = MemoryQuotaStore(lease_ttl_s=60.0)
    decision = await store.acquire("acme", limits, tokens=1200, request_id=rid)
    store.settle_soon("acme", limits, reserved_tokens=1200, actual_tokens=700, request_id=rid)
"""

from __future__ import annotations

import time
from collections.abc import Callable

from admission.quota.local import LocalLimiter
from admission.quota.types import LimitsLike, QuotaDecision

__all__ = ["MemoryQuotaStore"]


class MemoryQuotaStore:
    """Quotas and concurrency leases in this process; see the module docstring.

    ``concurrency_hint_ms`` caps the retry hint of a concurrency refusal, as in ``QuotaStore``.
    """

    fail_mode = "open"  # there is no store to lose

    def __init__(self, *, lease_ttl_s: float = 60.0, concurrency_hint_ms: int = 1000,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.lease_ttl_s = lease_ttl_s
        self._limiter = LocalLimiter(lease_ttl_s, concurrency_hint_ms)
        self._clock = clock
        self.num_acquires = 0
        self.num_refused = 0

    @property
    def is_redis_down(self) -> bool:
        """Always False: there is no Redis to be down."""
        return False

    @property
    def num_script_loads(self) -> int:
        return 0

    def counters(self) -> dict[str, int]:
        """The counters ``QuotaStore.counters`` has, those about Redis at 0."""
        return {"num_acquires": self.num_acquires, "num_refused": self.num_refused,
                "num_fail_open": 0, "num_fail_closed": 0, "num_redis_errors": 0,
                "num_outages": 0, "num_script_loads": 0, "num_redis_round_trips": 0}

    async def acquire(self, tenant_id: str, limits: LimitsLike, *, tokens: int,
                      request_id: str) -> QuotaDecision:
        """Admit one request of ``tokens`` (prompt + reserved output) or say why not;
        all-or-nothing, as ``QuotaStore.acquire``."""
        self.num_acquires += 1
        decision = self._limiter.acquire(tenant_id, limits, tokens=tokens, request_id=request_id,
                                         now_s=self._clock())
        if not decision.is_allowed:
            self.num_refused += 1
        return decision

    async def settle(self, tenant_id: str, limits: LimitsLike, *, reserved_tokens: int,
                     actual_tokens: int, request_id: str) -> bool:
        """Release the lease and charge ``actual_tokens`` instead of ``reserved_tokens``;
        True when a lease was released."""
        return self._limiter.settle(tenant_id, limits, reserved_tokens=reserved_tokens,
                                    actual_tokens=actual_tokens, request_id=request_id,
                                    now_s=self._clock())

    def settle_soon(self, tenant_id: str, limits: LimitsLike, *, reserved_tokens: int,
                    actual_tokens: int, request_id: str) -> None:
        """``settle``, done at once (it costs no I/O here)."""
        self._limiter.settle(tenant_id, limits, reserved_tokens=reserved_tokens,
                             actual_tokens=actual_tokens, request_id=request_id,
                             now_s=self._clock())

    async def renew(self, tenant_id: str, request_id: str) -> bool:
        """Extend the lease by ``lease_ttl_s``; False when it is gone."""
        return self._limiter.renew(request_id, self._clock())

    async def aclose(self) -> None:
        """Nothing to flush or close."""

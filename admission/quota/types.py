"""Value types of the quota store: limits in, a decision out, and OpenAI's rate-limit headers.

Pure: no I/O. ``QuotaStore`` (admission/quota/store.py) and the in-process fallback
(admission/quota/local.py) both return a :class:`QuotaDecision`.

Example::

    decision = await store.acquire("acme", QuotaLimits(60, 90_000, 4), tokens=1200, request_id=rid)
    if not decision.is_allowed:
        return error_response(decision.http_status, decision.message(), headers=decision.headers())
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, Protocol

WINDOW_MS = 60_000
"""Every rate here is "per minute": a limit N refills at N per 60 s, with a burst of N."""

RefusedBy = Literal["requests", "tokens", "concurrency", "too_large", "unavailable", "given_up"]

REFUSED_BY_CODE: dict[int, RefusedBy | None] = {
    0: None, 1: "requests", 2: "tokens", 3: "concurrency", 4: "too_large", 5: "given_up",
}
"""The Lua scripts return a small integer for the refusing limit; this maps it back."""


class LimitsLike(Protocol):
    """Anything with the three optional limits, e.g. ``gateway.keystore.Limits``."""

    @property
    def requests_per_minute(self) -> int | None: ...
    @property
    def tokens_per_minute(self) -> int | None: ...
    @property
    def max_concurrent(self) -> int | None: ...


class QuotaStoreLike(Protocol):
    """What the gateway asks of a quota store: ``admission.quota.store.QuotaStore`` (Redis,
    shared by every replica) or ``admission.quota.memory.MemoryQuotaStore`` (one replica, in
    process)."""

    async def acquire(self, tenant_id: str, limits: LimitsLike, *, tokens: int,
                      request_id: str) -> QuotaDecision: ...

    async def settle(self, tenant_id: str, limits: LimitsLike, *, reserved_tokens: int,
                     actual_tokens: int, request_id: str) -> bool: ...

    def settle_soon(self, tenant_id: str, limits: LimitsLike, *, reserved_tokens: int,
                    actual_tokens: int, request_id: str) -> None: ...

    async def renew(self, tenant_id: str, request_id: str) -> bool: ...

    async def aclose(self) -> None: ...

    def counters(self) -> dict[str, int]: ...

    @property
    def is_redis_down(self) -> bool: ...


@dataclass(frozen=True, slots=True)
class QuotaLimits:
    """A tenant's quotas; ``None`` (or 0) means unlimited.

    Example: ``QuotaLimits(requests_per_minute=60, tokens_per_minute=90_000, max_concurrent=4)``.
    """

    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None
    max_concurrent: int | None = None


@dataclass(slots=True, init=False)
class QuotaDecision:
    """The outcome of one admission: allowed or not, why, and the figures for the headers.

    ``retry_after_ms`` is the time until the refusing limit has room (None when allowed, when
    waiting cannot help, or when Redis is down). ``is_local`` marks a decision taken by the
    in-process fallback while Redis was unreachable (fail-open).
    """

    is_allowed: bool
    refused_by: RefusedBy | None
    retry_after_ms: int | None
    limit_requests: int | None
    remaining_requests: int | None
    reset_requests_ms: int | None
    limit_tokens: int | None
    remaining_tokens: int | None
    reset_tokens_ms: int | None
    limit_concurrent: int | None
    num_leases: int | None
    requested_tokens: int
    is_local: bool

    def __init__(self, is_allowed: bool, refused_by: RefusedBy | None = None,
                 retry_after_ms: int | None = None, limit_requests: int | None = None,
                 remaining_requests: int | None = None, reset_requests_ms: int | None = None,
                 limit_tokens: int | None = None, remaining_tokens: int | None = None,
                 reset_tokens_ms: int | None = None, limit_concurrent: int | None = None,
                 num_leases: int | None = None, requested_tokens: int = 0,
                 is_local: bool = False) -> None:
        self.is_allowed = is_allowed
        self.refused_by = refused_by
        self.retry_after_ms = retry_after_ms
        self.limit_requests = limit_requests
        self.remaining_requests = remaining_requests
        self.reset_requests_ms = reset_requests_ms
        self.limit_tokens = limit_tokens
        self.remaining_tokens = remaining_tokens
        self.reset_tokens_ms = reset_tokens_ms
        self.limit_concurrent = limit_concurrent
        self.num_leases = num_leases
        self.requested_tokens = requested_tokens
        self.is_local = is_local

    @property
    def retry_after_s(self) -> int | None:
        """``Retry-After`` in whole seconds (rounded up, at least 1), as HTTP requires."""
        if self.retry_after_ms is None:
            return None
        return max(1, math.ceil(self.retry_after_ms / 1000))

    @property
    def http_status(self) -> int:
        """200 when allowed, 503 when Redis is down and the store fails closed, else 429."""
        if self.is_allowed:
            return 200
        return 503 if self.refused_by == "unavailable" else 429

    def headers(self) -> dict[str, str]:
        """OpenAI's rate-limit headers (a trio per configured limit), plus ``retry-after`` and
        ``retry-after-ms`` on a refusal that waiting will cure."""
        headers: dict[str, str] = {}
        if self.limit_requests is not None:
            headers["x-ratelimit-limit-requests"] = str(self.limit_requests)
            headers["x-ratelimit-remaining-requests"] = str(self.remaining_requests or 0)
            headers["x-ratelimit-reset-requests"] = format_duration_ms(self.reset_requests_ms or 0)
        if self.limit_tokens is not None:
            headers["x-ratelimit-limit-tokens"] = str(self.limit_tokens)
            headers["x-ratelimit-remaining-tokens"] = str(self.remaining_tokens or 0)
            headers["x-ratelimit-reset-tokens"] = format_duration_ms(self.reset_tokens_ms or 0)
        if not self.is_allowed and self.retry_after_ms is not None:
            headers["retry-after"] = str(self.retry_after_s)
            headers["retry-after-ms"] = str(self.retry_after_ms)
        return headers

    def message(self) -> str:
        """A client-facing explanation in the spirit of OpenAI's rate-limit errors."""
        wait = (f" Please try again in {format_duration_ms(self.retry_after_ms)}."
                if self.retry_after_ms is not None else "")
        if self.refused_by == "requests":
            return (f"Rate limit reached for requests per minute: limit {self.limit_requests}, "
                    f"remaining {self.remaining_requests}.{wait}")
        if self.refused_by == "tokens":
            return (f"Rate limit reached for tokens per minute: limit {self.limit_tokens}, "
                    f"remaining {self.remaining_tokens}, requested {self.requested_tokens}.{wait}")
        if self.refused_by == "concurrency":
            return (f"Too many concurrent requests: limit {self.limit_concurrent}, "
                    f"in flight {self.num_leases}.{wait}")
        if self.refused_by == "too_large":
            return (f"Request too large for tokens per minute: limit {self.limit_tokens}, "
                    f"requested {self.requested_tokens} (prompt or input, and max_tokens). Lower "
                    "max_tokens or shorten the prompt or input.")
        if self.refused_by == "unavailable":
            return ("The quota service (Redis) is unavailable; this tenant's limits cannot be "
                    f"checked.{wait or ' Please retry shortly.'}")
        return "Allowed."


def format_duration_ms(duration_ms: int) -> str:
    """OpenAI's reset format (Go's ``time.Duration``): ``"20ms"``, ``"1s"``, ``"6m0s"``, ``"1.5s"``.

    >>> [format_duration_ms(ms) for ms in (0, 20, 1000, 1500, 360_000, 3_723_400)]
    ['0s', '20ms', '1s', '1.5s', '6m0s', '1h2m3.4s']
    """
    if duration_ms <= 0:
        return "0s"
    if duration_ms < 1000:
        return f"{duration_ms}ms"
    hours, rest_ms = divmod(duration_ms, 3_600_000)
    minutes, rest_ms = divmod(rest_ms, 60_000)
    seconds, millis = divmod(rest_ms, 1000)
    text = f"{seconds}.{millis:03d}".rstrip("0").rstrip(".") + "s"
    if hours:
        return f"{hours}h{minutes}m{text}"
    if minutes:
        return f"{minutes}m{text}"
    return text


def normalize_limit(value: int | None) -> int:
    """0 for "unlimited", else the positive limit (so scripts get integers only)."""
    return value if value is not None and value > 0 else 0

"""The in-process limiter the quota store falls back to while Redis is unreachable (fail-open).

Pure: the caller passes ``now_s`` (a monotonic clock). Same algorithm as the Lua scripts
(admission/quota/lua.py): a GCRA per tenant for requests and for tokens, and leases with a TTL
for concurrency. It knows only this replica's traffic, so during an outage each replica enforces
the full limits on its own.

Example::

    local = LocalLimiter(lease_ttl_s=60.0)
    decision = local.acquire("acme", limits, tokens=900, request_id="r1", now_s=time.monotonic())
    local.settle("acme", limits, reserved_tokens=900, actual_tokens=400, request_id="r1",
                 now_s=time.monotonic())
"""

from __future__ import annotations

import math

from admission.quota.types import (
    WINDOW_MS,
    LimitsLike,
    QuotaDecision,
    RefusedBy,
    normalize_limit,
)

_WINDOW_S = WINDOW_MS / 1000
_EPS_S = 1e-9


class _Gcra:
    """Debt in seconds of refill owed, anchored at ``at_s``; one per tenant and limit."""

    __slots__ = ("at_s", "debt_s")

    def __init__(self) -> None:
        self.debt_s = 0.0
        self.at_s = 0.0

    def debt_at(self, now_s: float) -> float:
        return max(0.0, self.debt_s - (now_s - self.at_s))

    def put(self, debt_s: float, now_s: float) -> None:
        self.debt_s, self.at_s = debt_s, now_s


class LocalLimiter:
    """Per-tenant rate limits and leases in this process only; see the module docstring."""

    def __init__(self, lease_ttl_s: float, concurrency_hint_ms: int = 1000) -> None:
        self._lease_ttl_s = lease_ttl_s
        self._concurrency_hint_ms = concurrency_hint_ms
        self._requests: dict[str, _Gcra] = {}
        self._tokens: dict[str, _Gcra] = {}
        self._leases: dict[str, dict[str, float]] = {}  # tenant -> request id -> expires_s
        self._lease_tenant: dict[str, str] = {}  # request id -> tenant

    def holds(self, request_id: str) -> bool:
        """Whether this limiter (not Redis) granted ``request_id``'s lease."""
        return request_id in self._lease_tenant

    def acquire(self, tenant_id: str, limits: LimitsLike, *, tokens: int, request_id: str,
                now_s: float) -> QuotaDecision:
        """Check all limits and, only if all pass, charge them all."""
        rpm = normalize_limit(limits.requests_per_minute)
        tpm = normalize_limit(limits.tokens_per_minute)
        max_concurrent = normalize_limit(limits.max_concurrent)
        refused: RefusedBy | None = None
        wait_s = 0.0

        def refuse(reason: RefusedBy, reason_wait_s: float) -> None:
            nonlocal refused, wait_s
            if refused != "too_large" and (refused is None or reason_wait_s > wait_s):
                refused, wait_s = reason, reason_wait_s

        req = self._requests.setdefault(tenant_id, _Gcra())
        req_debt_s = req.debt_at(now_s)
        req_step_s = _WINDOW_S / rpm if rpm else 0.0
        if rpm and req_debt_s + req_step_s - _WINDOW_S > _EPS_S:
            refuse("requests", req_debt_s + req_step_s - _WINDOW_S)
        tok = self._tokens.setdefault(tenant_id, _Gcra())
        tok_debt_s = tok.debt_at(now_s)
        tok_step_s = _WINDOW_S / tpm * tokens if tpm else 0.0
        if tpm and tokens > tpm:
            refused = "too_large"
        elif tpm and tok_debt_s + tok_step_s - _WINDOW_S > _EPS_S:
            refuse("tokens", tok_debt_s + tok_step_s - _WINDOW_S)
        leases = self._live_leases(tenant_id, now_s)
        num_leases = len(leases) - (request_id in leases)
        if max_concurrent and num_leases >= max_concurrent:
            earliest_s = min(leases.values()) - now_s
            refuse("concurrency", min(earliest_s, self._concurrency_hint_ms / 1000))

        if refused is None:
            if rpm:
                req_debt_s += req_step_s
                req.put(req_debt_s, now_s)
            if tpm:
                tok_debt_s += tok_step_s
                tok.put(tok_debt_s, now_s)
            if max_concurrent:
                leases[request_id] = now_s + self._lease_ttl_s
                self._lease_tenant[request_id] = tenant_id
                num_leases += 1
        retry_ms = (max(1, math.ceil(wait_s * 1000))
                    if refused is not None and refused != "too_large" else None)
        return QuotaDecision(
            is_allowed=refused is None, refused_by=refused, retry_after_ms=retry_ms,
            limit_requests=rpm or None,
            remaining_requests=_remaining(rpm, req_debt_s) if rpm else None,
            reset_requests_ms=math.ceil(req_debt_s * 1000) if rpm else None,
            limit_tokens=tpm or None,
            remaining_tokens=_remaining(tpm, tok_debt_s) if tpm else None,
            reset_tokens_ms=math.ceil(tok_debt_s * 1000) if tpm else None,
            limit_concurrent=max_concurrent or None,
            num_leases=num_leases if max_concurrent else None,
            requested_tokens=tokens, is_local=True,
        )

    def settle(self, tenant_id: str, limits: LimitsLike, *, reserved_tokens: int,
               actual_tokens: int, request_id: str, now_s: float) -> bool:
        """Release the lease and move the token debt by (actual - reserved); True if held."""
        tpm = normalize_limit(limits.tokens_per_minute)
        tok = self._tokens.get(tenant_id)
        if tpm and tok is not None and actual_tokens != reserved_tokens:
            extra_s = (actual_tokens - reserved_tokens) * _WINDOW_S / tpm
            tok.put(max(0.0, tok.debt_at(now_s) + extra_s), now_s)
        tenant = self._lease_tenant.pop(request_id, None)
        if tenant is None:
            return False
        return self._leases.get(tenant, {}).pop(request_id, None) is not None

    def renew(self, request_id: str, now_s: float) -> bool:
        """Extend a live local lease by the TTL; False if it is unknown or expired."""
        tenant = self._lease_tenant.get(request_id)
        if tenant is None or request_id not in self._live_leases(tenant, now_s):
            return False
        self._leases[tenant][request_id] = now_s + self._lease_ttl_s
        return True

    def _live_leases(self, tenant_id: str, now_s: float) -> dict[str, float]:
        leases = self._leases.setdefault(tenant_id, {})
        for request_id in [r for r, expires_s in leases.items() if expires_s <= now_s]:
            del leases[request_id]
            self._lease_tenant.pop(request_id, None)
        return leases


def _remaining(limit: int, debt_s: float) -> int:
    return max(0, math.floor((_WINDOW_S - debt_s) * limit / _WINDOW_S + 1e-6))

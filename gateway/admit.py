"""Per-request admission in the gateway: quotas (acquire before routing, settle when done),
then SLO admission (``admission.waiting_room``), whose tier errors and refusals become the
gateway's 400 / 403 / 503.

One Redis round trip per admitted request (``QuotaStore.acquire``, a single Lua script), none
for a tenant without limits. The settlement (lease release and token refund) is queued without
waiting (``QuotaStore.settle_soon``) and rides with the next request's acquire. Streams renew
their lease every third of its TTL, so a long stream never loses its slot, and a crashed
gateway's leases expire by themselves.

Example::

    ticket = await admit_quota(store, principal, plan, request_id)  # raises APIError 429/503
    try:
        ...  # serve, setting ticket.num_output_tokens
    finally:
        finish_quota(ticket)
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass

from admission.hints import TierHints, hinted_tier
from admission.quota.types import LimitsLike, QuotaStoreLike
from admission.tiers import (
    TIER_HEADER,
    Tier,
    TierConfigError,
    TierNotAllowedError,
    UnknownTierError,
)
from admission.waiting_room import AdmissionRefused, SloAdmission
from gateway.auth import Principal
from gateway.errors import APIError
from gateway.router import RoutePlan

_USAGE_RE = re.compile(rb'"completion_tokens"\s*:\s*(\d+)')


def tier_for(slo: SloAdmission, principal: Principal, requested: str | None,
             hints: TierHints | None = None) -> Tier:
    """The tier the request runs in: the tenant's (narrowed by the key's), or the lower one
    it asked for in ``x-switchyard-tier``, or else the one its priority or SLO hints from
    other ecosystems map to (``admission.hints``), never above the tenant's."""
    try:
        tier = slo.tier_for(principal.tenant.tier, principal.key.tier, requested)
        if hints is None or requested:
            return tier
        return hinted_tier(slo.tiers, tier, hints)
    except UnknownTierError as exc:
        raise APIError.bad_request(str(exc), param=TIER_HEADER, code="unknown_tier") from None
    except TierNotAllowedError as not_allowed:
        raise APIError.forbidden(str(not_allowed), code="tier_not_allowed",
                                 param=TIER_HEADER) from None
    except TierConfigError as misconfigured:
        raise APIError(500, f"Gateway misconfiguration: {misconfigured}", type="server_error",
                       code="tier_misconfigured") from None


def overloaded(refused: AdmissionRefused) -> APIError:
    """The 503 for an SLO admission refusal, with its Retry-After."""
    retry_s = refused.retry_after_s
    return APIError(
        503,
        f"The fleet cannot serve this {refused.tier.name!r}-tier request within its SLO right "
        f"now ({refused.reason}); retry after {retry_s} s or use a lower tier.",
        type="service_unavailable", code="overloaded",
        headers={"Retry-After": str(retry_s), "retry-after-ms": str(retry_s * 1000)},
    )


@dataclass(slots=True, init=False)
class QuotaTicket:
    """An admitted request's hold on its tenant's quotas."""

    store: QuotaStoreLike | None
    tenant_id: str
    limits: LimitsLike
    request_id: str
    reserved_tokens: int
    num_prompt_tokens: int
    headers: dict[str, str]
    needs_lease: bool
    limits_tokens: bool
    num_output_tokens: int

    def __init__(self, store: QuotaStoreLike | None, tenant_id: str, limits: LimitsLike,
                 request_id: str, reserved_tokens: int, num_prompt_tokens: int,
                 headers: dict[str, str] | None = None, needs_lease: bool = False,
                 limits_tokens: bool = False, num_output_tokens: int = 0) -> None:
        self.store = store
        self.tenant_id = tenant_id
        self.limits = limits
        self.request_id = request_id
        self.reserved_tokens = reserved_tokens
        self.num_prompt_tokens = num_prompt_tokens
        self.headers = {} if headers is None else headers
        self.needs_lease = needs_lease
        self.limits_tokens = limits_tokens
        self.num_output_tokens = num_output_tokens

    @property
    def is_limited(self) -> bool:
        return self.store is not None


def _has_limits(principal: Principal) -> bool:
    limits = principal.tenant.limits
    return bool(limits.requests_per_minute or limits.tokens_per_minute or limits.max_concurrent)


async def admit_quota(
    store: QuotaStoreLike, principal: Principal, plan: RoutePlan, request_id: str
) -> QuotaTicket:
    tenant = principal.tenant
    ticket = QuotaTicket(
        store=None, tenant_id=tenant.id, limits=tenant.limits, request_id=request_id,
        reserved_tokens=plan.reserved_tokens, num_prompt_tokens=plan.request.num_prompt_tokens,
    )
    if not _has_limits(principal):
        return ticket
    try:
        decision = await store.acquire(tenant.id, tenant.limits, tokens=plan.reserved_tokens,
                                       request_id=request_id)
    except asyncio.CancelledError:
        if tenant.limits.max_concurrent:
            # The client left while the script was on its way: Redis may still grant the
            # lease. A settle queued now goes out after it on the same connection, so Redis
            # runs it second and releases the lease (not left held until its TTL). Whether
            # the acquire was granted is unknown here, so the reservation is left charged.
            store.settle_soon(tenant.id, tenant.limits, reserved_tokens=plan.reserved_tokens,
                              actual_tokens=plan.reserved_tokens, request_id=request_id)
        raise
    if not decision.is_allowed:
        status = decision.http_status
        raise APIError(
            status, decision.message(),
            type="rate_limit_error" if status == 429 else "service_unavailable",
            code="rate_limit_exceeded" if status == 429 else "quota_store_unavailable",
            headers=decision.headers(),
        )
    ticket.store = store
    ticket.headers = decision.headers()
    ticket.needs_lease = bool(tenant.limits.max_concurrent)
    ticket.limits_tokens = bool(tenant.limits.tokens_per_minute)
    return ticket


def output_tokens_from(body_tail: bytes, num_events: int) -> int:
    """Completion tokens from a usage object when one was relayed, else one per SSE event
    (``num_events``: every ``data:`` line relayed) but the role, finish and ``[DONE]`` ones.

    Example::

        output_tokens_from(b'..."usage":{"completion_tokens":4}...', 9)   # 4
        output_tokens_from(b'...finish_reason":"length"}]}\n\ndata: [DONE]\n\n', 7)  # 4
    """
    match = _USAGE_RE.search(body_tail)
    if match is not None:
        return int(match.group(1))
    return max(0, num_events - 2 - (b"data: [DONE]" in body_tail))


def finish_quota(ticket: QuotaTicket) -> None:
    """Release the lease and settle tokens to the actual count, without delaying the response."""
    store = ticket.store
    if store is None:
        return
    ticket.store = None  # settle exactly once
    if not ticket.needs_lease and not ticket.limits_tokens:
        return  # a request-rate limit only: nothing held, nothing to refund
    # No task: the settle is queued in the store and rides with the next acquire.
    store.settle_soon(ticket.tenant_id, ticket.limits,
                      reserved_tokens=ticket.reserved_tokens,
                      actual_tokens=ticket.num_prompt_tokens + ticket.num_output_tokens,
                      request_id=ticket.request_id)


def renew_lease(ticket: QuotaTicket) -> None:
    if ticket.store is None or not ticket.needs_lease:
        return
    task = asyncio.get_running_loop().create_task(
        ticket.store.renew(ticket.tenant_id, ticket.request_id))
    _PENDING.add(task)
    task.add_done_callback(_PENDING.discard)


_PENDING: set[asyncio.Task[bool]] = set()

"""Tenant quotas in Redis, exact across gateway replicas: a Lua script call per request, or
per block of a busy tenant's requests.

``acquire`` checks and charges requests per minute, tokens per minute (prompt plus reserved
output) and a concurrency lease atomically on the Redis server's clock; ``settle`` releases the
lease and moves the token charge to the actual count; ``renew`` keeps a long stream's lease
alive. Leases are kept here, per request; Redis holds each replica's count of them (one hash
field per replica and tenant), sent with every op, so a lease costs Redis no command of its own.
A busy tenant far from its limits is served from a budget the replica draws from Redis in
blocks (admission/quota/budget.py): most of its requests make no Redis call, and none is
admitted over a limit. The script calls of all concurrent requests made in one event-loop
iteration share one
pipelined round trip, on the store's own connection (admission/quota/redis_pipe.py: RESP written by
hand, a fraction of redis-py's CPU per call) when the client is a plain ``Redis``, else through
the client (admission/quota/redis_batch.py). Every call is bounded by ``timeout_s``; on a
Redis error the store fails open (an in-process limiter, admission/quota/local.py) or closed (a
503 decision). Keys and the algorithm: docs/redis.md, "Quotas".

Example::

    store = QuotaStore(redis, lease_ttl_s=60.0, fail_mode="open", timeout_s=0.25)
    decision = await store.acquire(tenant.id, tenant.limits, tokens=1200, request_id=rid)
    if not decision.is_allowed:
        ...  # decision.http_status, decision.message(), decision.headers()
    try:
        ...  # serve; renew every lease_ttl_s / 3 while streaming
    finally:
        store.settle_soon(tenant.id, tenant.limits, reserved_tokens=1200, actual_tokens=used,
                          request_id=rid)   # or ``await store.settle(...)`` for its answer
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import itertools
import logging
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from admission.quota.budget import WINDOW_US, Budget, Limits3
from admission.quota.local import LocalLimiter
from admission.quota.lua import OPS_SCRIPT
from admission.quota.pipe import ScriptPipe
from admission.quota.redis_batch import ScriptBatcher
from admission.quota.redis_pipe import RespAddress, RespScriptPipe
from admission.quota.types import (
    REFUSED_BY_CODE,
    LimitsLike,
    QuotaDecision,
    QuotaLimits,
    normalize_limit,
)
from backends.redis_url import REDIS_ERRORS

__all__ = ["FailMode", "QuotaDecision", "QuotaLimits", "QuotaStore", "quota_keys"]

log = logging.getLogger(__name__)

FailMode = Literal["open", "closed"]
_UNAVAILABLE = QuotaDecision(is_allowed=False, refused_by="unavailable")


def quota_keys(tenant_id: str) -> tuple[str, str, str]:
    """The tenant's request GCRA, token GCRA and lease counts per gateway replica (a hash);
    one hash tag, so one cluster slot."""
    prefix = f"sy:quota:{{{tenant_id}}}"
    return f"{prefix}:req", f"{prefix}:tok", f"{prefix}:held"


@functools.lru_cache(maxsize=4096)
def ops_keys(tenant_id: str) -> tuple[str, str, str]:
    """OPS_SCRIPT's keys (``quota_keys``)."""
    return quota_keys(tenant_id)


def num_held(fields: Mapping[Any, Any], now_us: int) -> int:
    """The leases a tenant's held hash (``HGETALL`` of ``quota_keys(t)[2]``) counts live at
    server time ``now_us``: the sum over replicas whose entry has not expired."""
    total = 0
    for value in fields.values():
        text = value.decode() if isinstance(value, bytes) else value
        count, _, expiry = text.split(" ")
        if int(expiry) > now_us:
            total += int(count)
    return total


MAX_RESYNCED = 100_000  # tenants whose lease count is sent again once Redis answers


def _is_one(reply: Any) -> bool:
    """An op's reply ``1`` (bytes or str), as settle, renew and cancel answer yes."""
    return reply is not None and int(reply) == 1


class QuotaStore:
    """Quotas and concurrency leases shared by every gateway replica through Redis.

    ``concurrency_hint_ms`` caps the retry hint of a concurrency refusal: a slot frees when a
    holder settles, which nobody can predict, so the hint is the time until the earliest lease
    expires or this much, whichever is sooner. After a Redis error the store skips Redis for
    ``outage_retry_s`` (so an outage costs no waiting), then tries it again. Script calls are
    coalesced across concurrent requests: ``max_batch_size`` per pipeline, ``max_in_flight``
    pipelines outstanding. A plain ``Redis`` client lends only its address: the scripts go over
    the store's own connection (``own_connection=False`` sends them through the client).
    """

    def __init__(
        self,
        redis: aioredis.Redis | aioredis.RedisCluster,
        *,
        lease_ttl_s: float = 60.0,
        fail_mode: FailMode = "open",
        timeout_s: float = 0.25,
        concurrency_hint_ms: int = 1000,
        outage_retry_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        max_batch_size: int = 256,
        max_in_flight: int = 4,
        send_idle_calls_at_once: bool = True,
        settle_delay_s: float = 0.05,
        own_connection: bool = True,
        block_s: float = 0.1,
        idle_s: float | None = None,
    ) -> None:
        if fail_mode not in ("open", "closed"):
            raise ValueError(f"fail_mode must be 'open' or 'closed', not {fail_mode!r}")
        address = RespAddress.of(redis) if own_connection else None
        self._batcher: ScriptPipe = (
            RespScriptPipe(address, timeout_s=timeout_s, max_batch_size=max_batch_size,
                           max_in_flight=max_in_flight,
                           send_idle_calls_at_once=send_idle_calls_at_once)
            if address is not None else
            ScriptBatcher(redis, timeout_s=timeout_s, max_batch_size=max_batch_size,
                          max_in_flight=max_in_flight,
                          send_idle_calls_at_once=send_idle_calls_at_once))
        self.lease_ttl_s = lease_ttl_s
        # A settle waits up to this long to ride with the next acquire (0: sent at once).
        self.settle_delay_s = settle_delay_s
        self.fail_mode: FailMode = fail_mode
        self._timeout_s = timeout_s
        self._lease_ttl_ms = max(1, round(lease_ttl_s * 1000))
        self._concurrency_hint_ms = concurrency_hint_ms
        self._outage_retry_s = outage_retry_s
        self._clock = clock
        self._local = LocalLimiter(lease_ttl_s, concurrency_hint_ms)
        self._skip_redis_until = 0.0
        self._outage_started: float | None = None
        self.num_acquires = 0
        self.num_refused = 0
        self.num_fail_open = 0
        self.num_resynced = 0
        # This replica's leases in Redis, per tenant with max_concurrent: request id -> when
        # it lapses unless renewed (monotonic), oldest first. Redis holds only their count,
        # sent with each op as of the op's number (``_seq``): see OPS in lua.py.
        self._held: dict[str, OrderedDict[str, float]] = {}
        self._seq = itertools.count(1)
        self.replica_id = uuid.uuid4().hex[:16]  # its field in the held hashes
        self._header = (self._lease_ttl_ms, concurrency_hint_ms, self.replica_id)
        self._resync: set[str] = set()  # tenants whose count Redis may have wrong
        self.num_fail_closed = 0
        self.num_redis_errors = 0
        self.num_outages = 0
        # Budgets drawn from Redis in blocks and spent here (admission/quota/budget.py);
        # block_s 0: every request is judged in Redis.
        self._block_s = block_s
        self._idle_s = idle_s if idle_s is not None else max(10 * block_s, 0.5)
        self._budgets: dict[str, Budget] = {}
        self._sweep_handle: asyncio.TimerHandle | None = None
        self.num_spent_here = 0

    @property
    def num_script_loads(self) -> int:
        """Script calls sent again with ``EVAL`` after a ``NOSCRIPT``."""
        return self._batcher.num_script_loads

    @property
    def num_budgets(self) -> int:
        """Tenants with a budget in this replica (admission/quota/budget.py)."""
        return len(self._budgets)

    @property
    def is_redis_down(self) -> bool:
        """True from a Redis error until the next successful call."""
        return self._outage_started is not None

    def counters(self) -> dict[str, int]:
        """Monotonic counters for metrics (``num_*``)."""
        return {
            "num_acquires": self.num_acquires,
            "num_refused": self.num_refused,
            "num_fail_open": self.num_fail_open,
            "num_fail_closed": self.num_fail_closed,
            "num_redis_errors": self.num_redis_errors,
            "num_outages": self.num_outages,
            "num_script_loads": self.num_script_loads,
            "num_redis_round_trips": self._batcher.num_round_trips,
            "num_spent_here": self.num_spent_here,
        }

    async def acquire(self, tenant_id: str, limits: LimitsLike, *, tokens: int,
                      request_id: str) -> QuotaDecision:
        """Admit one request of ``tokens`` (prompt + reserved output) or say why not.

        Spent from the tenant's budget here when it holds enough (no Redis call), else one op
        of ``OPS_SCRIPT``, in one command with the tenant's other ops of this loop iteration,
        which gives back the budget's credit and draws the request and the next block;
        all-or-nothing: a refused request charges nothing and holds no lease.
        """
        self.num_acquires += 1
        rpm = normalize_limit(limits.requests_per_minute)
        tpm = normalize_limit(limits.tokens_per_minute)
        max_concurrent = normalize_limit(limits.max_concurrent)
        now_s = self._clock()
        budget = self._budget(tenant_id, (rpm, tpm, max_concurrent), now_s)
        if budget is not None:
            num_in_flight = 0
            if max_concurrent:
                num_in_flight = len(self._leases(tenant_id))
                if now_s - budget.written_s >= self.lease_ttl_s:
                    budget.reserved = budget.sent = 0  # the count in Redis has expired
            if budget.limits == (rpm, tpm, max_concurrent) and budget.can_spend(
                    tokens, num_in_flight):
                budget.spend(tokens, now_s)
                if max_concurrent:
                    self._held[tenant_id][request_id] = now_s + self.lease_ttl_s
                self.num_spent_here += 1
                return _decision(budget.limits, budget.remaining(now_s), tokens=tokens,
                                 num_leases=num_in_flight + 1)
            budget.limits = (rpm, tpm, max_concurrent)
            budget.counted(tokens, now_s)
        seq = held = need = 0
        if max_concurrent:
            if self._resync and self._clock() >= self._skip_redis_until:
                await self._send_counts()  # before this lease is counted here
            leases = self._leases(tenant_id)
            held = num_before = len(leases)
            leases[request_id] = self._clock() + self.lease_ttl_s  # counted from now on
            seq = next(self._seq)
            if budget is not None:
                held = budget.count(num_before)  # the slots kept, this request's among them
                budget.reserved = min(budget.reserved, held)
                budget.last_seq, budget.written_s = seq, now_s
                budget.spent_since_write = False
            need = held if held > num_before else num_before + 1
        credit: tuple[float, float] = (0.0, 0.0)
        block = (0, 0, 0)
        if budget is not None:
            credit = budget.take_credit()
            block = budget.want(now_s, self._block_s)
            if max_concurrent:
                budget.sent = need + block[2]
            budget.num_drawing += 1
        args = (*self._header, "A", rpm, tpm, max_concurrent, tokens, seq, held, need,
                _micros(credit[0]), _micros(credit[1]), *block)
        try:
            reply = await self._call(ops_keys(tenant_id), args)
        finally:
            if budget is not None:
                budget.num_drawing -= 1
        if reply is None:
            if max_concurrent:
                # It may still run (Redis paused, or its reply lost) and count this lease:
                # the count is sent again once Redis answers, without it.
                self._drop_lease(tenant_id, request_id, resync=True)
            decision = self._fallback(tenant_id, limits, tokens=tokens, request_id=request_id)
        else:
            (allowed, code, retry_ms, rem_req, reset_req, rem_tok, reset_tok, num_leases,
             extra_req, extra_tok, own_count) = map(int, reply.split())
            figures = (rem_req, reset_req, rem_tok, reset_tok)
            if budget is not None:
                now_s = self._clock()
                budget.replied_s = now_s
                (budget.remaining_requests, budget.reset_requests_ms,
                 budget.remaining_tokens, budget.reset_tokens_ms) = figures
                if allowed:
                    budget.granted(block, (extra_req, extra_tok), max(0, own_count - need))
                else:
                    budget.forget_block()
                if max_concurrent and seq == budget.last_seq:
                    budget.reserved = budget.sent = own_count
                figures = budget.remaining(now_s)
            decision = _decision(
                (rpm, tpm, max_concurrent), figures, tokens=tokens, num_leases=num_leases,
                allowed=bool(allowed), refused_by=REFUSED_BY_CODE[code],
                retry_after_ms=retry_ms if retry_ms >= 0 else None)
        if not decision.is_allowed:
            self.num_refused += 1
            if max_concurrent:
                # Ops sent while this one was out counted it; the next op, or this deferred
                # one, gives Redis the count without it.
                self._drop_lease(tenant_id, request_id, resync=False)
                self._send_count_soon(tenant_id)
        return decision

    # -- this replica's budgets -------------------------------------------------------
    def _budget(self, tenant_id: str, limits: Limits3, now_s: float) -> Budget | None:
        """The tenant's budget here (made on its first acquire); None without blocks."""
        if self._block_s <= 0:
            return None
        budget = self._budgets.get(tenant_id)
        if budget is None:
            budget = self._budgets[tenant_id] = Budget(limits, now_s)
            self._arm_sweep()
        return budget

    def _settle_here(self, budget: Budget, tenant_id: str, limits: LimitsLike,
                     reserved_tokens: int, actual_tokens: int, request_id: str) -> bool:
        """Put a finished request's slot and unused tokens back in the budget; whether it
        held a lease here."""
        tpm = normalize_limit(limits.tokens_per_minute)
        if tpm:
            budget.tok_us += (reserved_tokens - actual_tokens) * WINDOW_US / tpm
        if not normalize_limit(limits.max_concurrent):
            return True
        was_held = request_id in self._held.get(tenant_id, ())
        self._drop_lease(tenant_id, request_id, resync=False)
        return was_held

    def _num_in_flight(self, tenant_id: str) -> int:
        return len(self._leases(tenant_id)) if tenant_id in self._held else 0

    def _return_args(self, tenant_id: str, budget: Budget, *,
                     everything: bool = False) -> tuple[str | int, ...]:
        """The op giving back what the budget holds beyond what it may keep (``everything``:
        all of it), with this replica's count of slots."""
        if everything:
            budget.forget_block()
        req_us, tok_us = budget.take_excess()
        seq, count = 0, -1
        if budget.limits[2] or tenant_id in self._held:
            count = budget.sent = budget.count(self._num_in_flight(tenant_id))
            budget.reserved = min(budget.reserved, count)
            seq = next(self._seq)
            budget.last_seq, budget.written_s = seq, self._clock()
            budget.spent_since_write = False
        return (*self._header, "R", seq, count, _micros(req_us), _micros(tok_us))

    def _return_soon(self, tenant_id: str, budget: Budget) -> None:
        """Give back the budget's excess with the next op sent, or after ``settle_delay_s``,
        as a settle without a budget goes."""
        if self._clock() < self._skip_redis_until:
            return  # kept here; the next op or sweep gives it back
        args = self._return_args(tenant_id, budget)
        if self.settle_delay_s > 0:
            future = self._batcher.defer(OPS_SCRIPT, ops_keys(tenant_id), args,
                                         self.settle_delay_s)
            future.add_done_callback(functools.partial(self._on_settled, tenant_id))
        else:
            self._send_op(tenant_id, args)

    def _send_op(self, tenant_id: str, args: tuple[str | int, ...]) -> asyncio.Future[Any]:
        future = self._batcher.call(OPS_SCRIPT, ops_keys(tenant_id), args)
        future.add_done_callback(functools.partial(self._on_settled, tenant_id))
        return future

    def _arm_sweep(self) -> None:
        if self._sweep_handle is None and self._budgets:
            interval_s = min(self._idle_s / 2, self.lease_ttl_s / 6)
            self._sweep_handle = asyncio.get_running_loop().call_later(interval_s, self._sweep)

    def _sweep(self) -> None:
        """Give back the budgets of tenants idle for ``idle_s`` (and drop them once empty);
        renew this replica's count for the others every ``lease_ttl_s / 3``: spending here
        writes nothing to Redis."""
        self._sweep_handle = None
        now_s = self._clock()
        if now_s >= self._skip_redis_until:
            for tenant_id, budget in list(self._budgets.items()):
                num_in_flight = self._num_in_flight(tenant_id)
                is_idle = now_s - budget.used_s >= self._idle_s
                if is_idle and budget.is_empty(num_in_flight):
                    del self._budgets[tenant_id]
                elif is_idle and budget.holds_spare(num_in_flight):
                    self._send_op(tenant_id,
                                  self._return_args(tenant_id, budget, everything=True))
                elif (budget.spent_since_write
                      and now_s - budget.written_s >= self.lease_ttl_s / 3):
                    # Slots taken here since the count was last written: keep it live.
                    self._send_op(tenant_id, self._return_args(tenant_id, budget))
        self._arm_sweep()

    # -- this replica's leases --------------------------------------------------------
    def _leases(self, tenant_id: str) -> OrderedDict[str, float]:
        """The tenant's live leases here, those past their time dropped (a request whose
        settle never came frees its slot after ``lease_ttl_s``, as a crashed replica's do)."""
        held = self._held.get(tenant_id)
        if held is None:
            held = self._held[tenant_id] = OrderedDict()
            return held
        if held:
            now_s = self._clock()
            while held and next(iter(held.values())) <= now_s:
                held.popitem(last=False)
        return held

    def _drop_lease(self, tenant_id: str, request_id: str, *, resync: bool) -> int:
        """Forget a lease here; the tenant's count of the rest. ``resync``: Redis may count it
        (its op's answer never came): the count goes again once Redis answers."""
        held = self._leases(tenant_id)
        held.pop(request_id, None)
        if resync:
            self._mark_resync(tenant_id)
        count = len(held)
        if not count:
            del self._held[tenant_id]
        return count

    def _count_args(self, tenant_id: str) -> tuple[str | int, ...]:
        count = self._num_in_flight(tenant_id)
        seq = next(self._seq)
        budget = self._budgets.get(tenant_id)
        if budget is not None:
            count = budget.sent = budget.count(count)
            budget.reserved = min(budget.reserved, count)
            budget.last_seq, budget.written_s = seq, self._clock()
            budget.spent_since_write = False
        return (*self._header, "H", seq, count)

    def _mark_resync(self, tenant_id: str) -> None:
        """Redis may have the tenant's count wrong: send it again once Redis answers."""
        if len(self._resync) < MAX_RESYNCED:
            self._resync.add(tenant_id)

    def _send_count_soon(self, tenant_id: str) -> None:
        if self._clock() < self._skip_redis_until:
            self._mark_resync(tenant_id)
            return
        future = self._batcher.defer(OPS_SCRIPT, ops_keys(tenant_id),
                                     self._count_args(tenant_id), max(self.settle_delay_s, 0.001))
        future.add_done_callback(functools.partial(self._on_count_sent, tenant_id))

    def _on_count_sent(self, tenant_id: str, future: asyncio.Future[Any]) -> None:
        if future.cancelled() or future.exception() is not None:
            self._mark_resync(tenant_id)

    async def settle(self, tenant_id: str, limits: LimitsLike, *, reserved_tokens: int,
                     actual_tokens: int, request_id: str) -> bool:
        """Release the lease and charge ``actual_tokens`` instead of ``reserved_tokens`` (a
        refund, or an extra charge when the answer ran over). Call it exactly once per admitted
        request (in a ``finally``: completion or client disconnect), never for a refused one.
        One script call; never raises. Returns whether a lease was released (one was held
        here, and Redis took the count without it); if Redis is down, the count is sent again
        once it answers and the refund is dropped."""
        if self._local.holds(request_id):
            return self._local.settle(tenant_id, limits, reserved_tokens=reserved_tokens,
                                      actual_tokens=actual_tokens, request_id=request_id,
                                      now_s=self._clock())
        limited = bool(normalize_limit(limits.max_concurrent))
        budget = self._budgets.get(tenant_id)
        if budget is not None:
            was_held = self._settle_here(budget, tenant_id, limits, reserved_tokens,
                                         actual_tokens, request_id)
            if not budget.has_excess(self._num_in_flight(tenant_id)):
                return was_held
            reply = await self._call(ops_keys(tenant_id), self._return_args(tenant_id, budget),
                                     deferrable=True)
            if reply is None and limited:
                self._mark_resync(tenant_id)
            return was_held and reply is not None
        was_held = not limited or request_id in self._held.get(tenant_id, ())
        args = self._settle_args(tenant_id, limits, reserved_tokens, actual_tokens, request_id)
        reply = await self._call(ops_keys(tenant_id), args, deferrable=True)
        if reply is None and limited:
            self._mark_resync(tenant_id)
        return was_held and _is_one(reply)

    def _settle_args(self, tenant_id: str, limits: LimitsLike, reserved_tokens: int,
                     actual_tokens: int, request_id: str) -> tuple[str | int, ...]:
        """The settle op; with ``max_concurrent`` the lease is forgotten here now, and the op
        carries the count of the rest."""
        seq, count = 0, -1
        if normalize_limit(limits.max_concurrent):
            count = self._drop_lease(tenant_id, request_id, resync=False)
            seq = next(self._seq)
        return (*self._header, "S", normalize_limit(limits.tokens_per_minute), reserved_tokens,
                actual_tokens, seq, count)

    def settle_soon(self, tenant_id: str, limits: LimitsLike, *, reserved_tokens: int,
                    actual_tokens: int, request_id: str) -> None:
        """``settle`` without waiting for its answer, and without a task: the call is queued
        (it rides with the next acquire, or leaves after ``settle_delay_s``) and its outcome
        recorded when the reply comes."""
        if self._local.holds(request_id):
            self._local.settle(tenant_id, limits, reserved_tokens=reserved_tokens,
                               actual_tokens=actual_tokens, request_id=request_id,
                               now_s=self._clock())
            return
        budget = self._budgets.get(tenant_id)
        if budget is not None:
            self._settle_here(budget, tenant_id, limits, reserved_tokens, actual_tokens,
                              request_id)
            if budget.has_excess(self._num_in_flight(tenant_id)):
                self._return_soon(tenant_id, budget)
            return
        if self._clock() < self._skip_redis_until:
            # Redis is down: the lease is forgotten here and its count sent when it is back;
            # the token refund is dropped (the charge stays as reserved).
            if normalize_limit(limits.max_concurrent):
                self._drop_lease(tenant_id, request_id, resync=True)
            return
        keys = ops_keys(tenant_id)
        args = self._settle_args(tenant_id, limits, reserved_tokens, actual_tokens, request_id)
        if self.settle_delay_s > 0:
            future = self._batcher.defer(OPS_SCRIPT, keys, args, self.settle_delay_s)
        else:
            future = self._batcher.call(OPS_SCRIPT, keys, args)
        future.add_done_callback(functools.partial(
            self._on_settled, tenant_id if normalize_limit(limits.max_concurrent) else None))

    def _on_settled(self, tenant_id: str | None, future: asyncio.Future[Any]) -> None:
        """A settle's answer; when it never came, the tenant's count (``tenant_id``: it has
        ``max_concurrent``) goes again once Redis answers."""
        if future.cancelled():
            if tenant_id is not None:
                self._mark_resync(tenant_id)
            return
        exc = future.exception()
        if exc is None:
            self._on_success()
        elif isinstance(exc, (RedisError, OSError, TimeoutError)):
            if tenant_id is not None:
                self._mark_resync(tenant_id)
            self._on_error(exc)
        else:
            log.error("quota store: settle failed: %r", exc)

    async def aclose(self) -> None:
        """Give back every budget, send the deferred settles (waiting up to 1 s for them) and
        close the store's own Redis connection, if it has one (not the client's)."""
        if self._sweep_handle is not None:
            self._sweep_handle.cancel()
            self._sweep_handle = None
        if self._clock() >= self._skip_redis_until:
            for tenant_id, budget in self._budgets.items():
                if not budget.is_empty(self._num_in_flight(tenant_id)):
                    self._send_op(tenant_id,
                                  self._return_args(tenant_id, budget, everything=True))
        self._budgets.clear()
        await self._batcher.aclose()

    async def renew(self, tenant_id: str, request_id: str) -> bool:
        """Extend the lease by ``lease_ttl_s``; call every ``lease_ttl_s / 3`` while streaming
        (it also keeps this replica's count in Redis from expiring). False when the lease is
        gone (it lapsed, or was settled) or Redis is unreachable."""
        if self._local.holds(request_id):
            return self._local.renew(request_id, self._clock())
        held = self._held.get(tenant_id)
        if held is None or request_id not in self._leases(tenant_id):
            return False
        held[request_id] = self._clock() + self.lease_ttl_s
        held.move_to_end(request_id)
        reply = await self._call(ops_keys(tenant_id), self._count_args(tenant_id))
        return reply is not None

    # -- Redis I/O ---------------------------------------------------------------------
    async def _call(self, keys: Sequence[str], args: Sequence[str | int], *,
                    deferrable: bool = False) -> Any:
        """Run one op of ``OPS_SCRIPT``: its reply, or None after an error or timeout
        (recorded). A ``deferrable`` call rides with the next one sent, or leaves after
        ``settle_delay_s``."""
        script = OPS_SCRIPT
        if self._clock() < self._skip_redis_until:
            return None
        if self._resync:  # answered before this call goes (their script may need loading)
            await self._send_counts()
        batcher = self._batcher
        try:
            if batcher.bounds_calls:  # it answers every call within timeout_s itself
                reply = await (batcher.defer(script, keys, args, self.settle_delay_s)
                               if deferrable and self.settle_delay_s > 0
                               else batcher.call(script, keys, args))
            else:
                async with asyncio.timeout(self._timeout_s + (self.settle_delay_s if deferrable
                                                              else 0.0)):
                    reply = await (batcher.run_deferred(script, keys, args, self.settle_delay_s)
                                   if deferrable and self.settle_delay_s > 0
                                   else batcher.run(script, keys, args))
        except REDIS_ERRORS as exc:
            self._on_error(exc)
            return None
        if self._outage_started is not None:
            self._on_success()
        return reply

    def _on_success(self) -> None:
        if self._outage_started is not None:
            log.warning("quota store: Redis is back after %.1f s",
                        self._clock() - self._outage_started)
            self._outage_started = None

    async def _send_counts(self) -> None:
        """Send again the lease counts Redis may have wrong: after an op whose answer never
        came (an acquire that may yet run, a settle that may be lost). Those that fail wait
        for the next call."""
        tenants, self._resync = self._resync, set()
        self.num_resynced += len(tenants)
        futures = []
        for tenant_id in tenants:
            future = self._batcher.call(OPS_SCRIPT, ops_keys(tenant_id),
                                        self._count_args(tenant_id))
            future.add_done_callback(functools.partial(self._on_count_sent, tenant_id))
            futures.append(future)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self._timeout_s):
                await asyncio.wait(futures)

    def _on_error(self, exc: BaseException) -> None:
        self.num_redis_errors += 1
        now_s = self._clock()
        self._skip_redis_until = now_s + self._outage_retry_s
        if self._outage_started is None:
            self._outage_started = now_s
            self.num_outages += 1
            log.warning("quota store: Redis unreachable (%s: %s); failing %s until it answers",
                        type(exc).__name__, exc, self.fail_mode)

    def _fallback(self, tenant_id: str, limits: LimitsLike, *, tokens: int,
                  request_id: str) -> QuotaDecision:
        if self.fail_mode == "closed":
            self.num_fail_closed += 1
            # Redis is tried again after outage_retry_s: the client may come back then.
            return dataclasses.replace(
                _UNAVAILABLE, retry_after_ms=max(1, round(self._outage_retry_s * 1000)))
        self.num_fail_open += 1
        return self._local.acquire(tenant_id, limits, tokens=tokens, request_id=request_id,
                                   now_s=self._clock())


def _micros(value: float) -> str | int:
    """Credit for an op: µs of debt to 1 ns, or 0."""
    return 0 if abs(value) < 1e-3 else f"{value:.3f}"


def _decision(limits: Limits3, figures: tuple[int, int, int, int], *, tokens: int,
              num_leases: int, allowed: bool = True, refused_by: Any = None,
              retry_after_ms: int | None = None) -> QuotaDecision:
    """A decision with the headers' figures (remaining requests, their reset, remaining
    tokens, their reset) for the limits set."""
    rpm, tpm, max_concurrent = limits
    rem_req, reset_req, rem_tok, reset_tok = figures
    return QuotaDecision(
        is_allowed=allowed, refused_by=refused_by, retry_after_ms=retry_after_ms,
        limit_requests=rpm or None,
        remaining_requests=rem_req if rpm else None,
        reset_requests_ms=reset_req if rpm else None,
        limit_tokens=tpm or None,
        remaining_tokens=rem_tok if tpm else None,
        reset_tokens_ms=reset_tok if tpm else None,
        limit_concurrent=max_concurrent or None,
        num_leases=num_leases if max_concurrent else None,
        requested_tokens=tokens,
    )

"""Usage accounting: requests, tokens and cost per tenant, key and model, by the hour.

Every request a backend answered with 200 is charged once, as it ends: its prompt tokens
(the engine's usage when it reported one, else the gateway's count), the cached share of them
when the engine said, its output tokens (relayed ones for a stream cut short), and the cost at
the prices configured then (``usage.prices``, per million tokens). Requests refused or failed
before a backend answered cost nothing and are not charged.

Charges are added up in this process and flushed every ``flush_interval_s`` to Redis, where
each replica's batch is applied by one script, at most once (a batch id marks it applied,
so a flush retried after a lost reply never counts twice): the totals are exact across
replicas, and a replica's last second shows up at its next flush. While Redis is away the
batches wait here (bounded: ``MAX_PENDING_FIELDS``, then the oldest are dropped and counted)
and go out when it is back. With ``state: memory`` the book is kept in this process.

Layout: one hash per tenant and hour, ``sy:usage:{<tenant>}:<hour>`` (the hour since the epoch),
fields ``<key id>\\x1f<model>\\x1f<kind>`` with integer values; kinds are ``requests``,
``prompt_tokens``, ``cached_tokens``, ``output_tokens`` and ``cost_nano`` (the cost in
1e-9 currency units). Hashes expire ``retention_days`` after their last write.

Example::

    book = UsageBook(redis, UsageSettings(prices={"m": PriceSettings(prompt=0.5, output=1.5)}))
    book.charge("acme", "k-1", "m", prompt_tokens=800, cached_tokens=512, output_tokens=40)
    await book.flush()
    rows = await book.query(["acme"], from_s=t0, to_s=t1)
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import redis.asyncio as aioredis

from backends.redis_url import REDIS_ERRORS
from gateway.settings import PriceSettings, UsageSettings

log = logging.getLogger(__name__)

BUCKET_S = 3600
KINDS = ("requests", "prompt_tokens", "cached_tokens", "output_tokens", "cost_nano")
SEPARATOR = "\x1f"
MAX_PENDING_FIELDS = 200_000  # ~30 MB at most, while Redis is away
MAX_QUERY_BUCKETS = 24 * 366  # a year of hours in one query

# KEYS[1]: the tenant's hash for the hour; KEYS[2]: the batch's marker.
# ARGV[1]: the hash's TTL, ARGV[2]: the marker's TTL, then field, increment pairs.
_APPLY_LUA = """
if not redis.call('SET', KEYS[2], '1', 'NX', 'EX', ARGV[2]) then return 0 end
for i = 3, #ARGV, 2 do redis.call('HINCRBY', KEYS[1], ARGV[i], ARGV[i + 1]) end
redis.call('EXPIRE', KEYS[1], ARGV[1])
return 1
"""
MARKER_TTL_S = 86_400


def cost_nano(price: PriceSettings, prompt_tokens: int, cached_tokens: int,
              output_tokens: int) -> int:
    """The cost in 1e-9 units (a price per million tokens is 1e3 nano-units a token)."""
    cached_price = price.prompt if price.cached is None else price.cached
    uncached = max(0, prompt_tokens - cached_tokens)
    return round(1000 * (uncached * price.prompt + cached_tokens * cached_price
                         + output_tokens * price.output))


def hour_of(epoch_s: float) -> int:
    return int(epoch_s // BUCKET_S)


def usage_key(tenant_id: str, hour: int) -> str:
    return f"sy:usage:{{{tenant_id}}}:{hour}"


@dataclass(slots=True)
class _Batch:
    """One tenant-hour's charges, applied at most once under ``batch_id``."""

    tenant_id: str
    hour: int
    fields: dict[str, int]
    batch_id: str = field(default_factory=lambda: os.urandom(12).hex())


@dataclass(slots=True, init=False)
class UsageRow:
    tenant: str
    key_id: str
    model: str
    requests: int
    prompt_tokens: int
    cached_tokens: int
    output_tokens: int
    cost_nano: int

    def __init__(self, tenant: str, key_id: str, model: str, requests: int = 0,
                 prompt_tokens: int = 0, cached_tokens: int = 0, output_tokens: int = 0,
                 cost_nano: int = 0) -> None:
        self.tenant = tenant
        self.key_id = key_id
        self.model = model
        self.requests = requests
        self.prompt_tokens = prompt_tokens
        self.cached_tokens = cached_tokens
        self.output_tokens = output_tokens
        self.cost_nano = cost_nano

    def add(self, kind: str, value: int) -> None:
        setattr(self, kind, getattr(self, kind) + value)

    def as_json(self, currency: str) -> dict[str, Any]:
        return {"tenant": self.tenant, "key_id": self.key_id, "model": self.model,
                "requests": self.requests, "prompt_tokens": self.prompt_tokens,
                "cached_tokens": self.cached_tokens, "output_tokens": self.output_tokens,
                "cost": self.cost_nano / 1e9, "currency": currency}


class UsageBook:
    """Charges requests and answers usage queries; ``redis`` None keeps the book in memory."""

    def __init__(self, redis: aioredis.Redis | None, settings: UsageSettings | None = None, *,
                 clock: Callable[[], float] = time.time) -> None:
        self.settings = settings or UsageSettings()
        self._redis = redis
        self._clock = clock
        self._pending: dict[tuple[str, int], dict[str, int]] = defaultdict(
            lambda: defaultdict(int))
        self._unsent: list[_Batch] = []  # cut from pending, not yet applied (Redis away)
        self._memory: dict[tuple[str, int], dict[str, int]] = defaultdict(
            lambda: defaultdict(int))
        self._apply = redis.register_script(_APPLY_LUA) if redis is not None else None
        self._flush_lock = asyncio.Lock()
        self.num_dropped_fields = 0
        self.num_flush_failures = 0

    @property
    def is_enabled(self) -> bool:
        return self.settings.enabled

    def charge(self, tenant_id: str, key_id: str, model: str, *, prompt_tokens: int,
               cached_tokens: int, output_tokens: int) -> int:
        """Book one answered request; returns its cost in nano-units. Never waits."""
        price = self.settings.prices.get(model)
        cost = (cost_nano(price, prompt_tokens, cached_tokens, output_tokens)
                if price is not None else 0)
        book = self._memory if self._redis is None else self._pending
        fields = book[(tenant_id, hour_of(self._clock()))]
        stem = f"{key_id}{SEPARATOR}{model}{SEPARATOR}"
        for kind, value in (("requests", 1), ("prompt_tokens", prompt_tokens),
                            ("cached_tokens", cached_tokens), ("output_tokens", output_tokens),
                            ("cost_nano", cost)):
            if value:
                fields[stem + kind] += value
        return cost

    async def run(self) -> None:
        """Flush every ``flush_interval_s`` until cancelled (then once more, briefly)."""
        if self._redis is None:
            return
        # No await in an except or finally block of a compiled module
        # (tests/routing/test_native.py): the last flush comes after the ``try``.
        stopped: BaseException | None = None
        try:
            while True:
                await asyncio.sleep(self.settings.flush_interval_s)
                await self.flush()
        except BaseException as exc:  # cancelled, or a flush's own error
            stopped = exc
        await self._last_flush()
        if stopped is not None:
            raise stopped

    async def _last_flush(self) -> None:
        if self._pending or self._unsent:
            try:
                async with asyncio.timeout(1.0):
                    await self.flush()
            except (TimeoutError, asyncio.CancelledError):
                log.warning("usage: %d unsent charge fields lost at shutdown",
                            self.num_pending_fields)

    @property
    def num_pending_fields(self) -> int:
        return (sum(len(f) for f in self._pending.values())
                + sum(len(b.fields) for b in self._unsent))

    async def flush(self) -> bool:
        """Apply every waiting batch; True when none is left waiting."""
        if self._apply is None:
            return True
        async with self._flush_lock:
            pending, self._pending = self._pending, defaultdict(lambda: defaultdict(int))
            self._unsent += [_Batch(tenant, hour, dict(fields))
                             for (tenant, hour), fields in pending.items()]
            ttl_s = self.settings.retention_days * 86_400
            while self._unsent:
                batch = self._unsent[0]
                args: list[Any] = [ttl_s, MARKER_TTL_S]
                for name, value in batch.fields.items():
                    args += [name, value]
                marker = f"{usage_key(batch.tenant_id, batch.hour)}:batch:{batch.batch_id}"
                try:
                    await self._apply(keys=[usage_key(batch.tenant_id, batch.hour), marker],
                                      args=args)
                except REDIS_ERRORS as exc:
                    self.num_flush_failures += 1
                    self._bound_unsent()
                    log.warning("usage: cannot add charges to Redis (%s); %d fields wait "
                                "for it", type(exc).__name__, self.num_pending_fields)
                    return False
                self._unsent.pop(0)
            return True

    def _bound_unsent(self) -> None:
        excess = sum(len(b.fields) for b in self._unsent) - MAX_PENDING_FIELDS
        while excess > 0 and self._unsent:
            dropped = self._unsent.pop(0)
            self.num_dropped_fields += len(dropped.fields)
            excess -= len(dropped.fields)
            log.error("usage: %d charge fields dropped: Redis has been away too long",
                      len(dropped.fields))

    async def query(self, tenant_ids: Iterable[str], from_s: float, to_s: float
                    ) -> list[UsageRow]:
        """Rows per (tenant, key, model) over the hours that hold ``[from_s, to_s)``."""
        first, last = hour_of(from_s), hour_of(max(from_s, to_s - 1e-6))
        hours = range(first, last + 1)
        wanted = list(dict.fromkeys(tenant_ids))
        rows: dict[tuple[str, str, str], UsageRow] = {}
        if self._redis is None:
            buckets: list[tuple[str, dict[Any, Any]]] = [
                (tenant, self._memory.get((tenant, hour), {}))
                for tenant in wanted for hour in hours]
        else:
            pipe = self._redis.pipeline(transaction=False)
            for tenant in wanted:
                for hour in hours:
                    pipe.hgetall(usage_key(tenant, hour))
            replies = await pipe.execute()
            buckets = [(tenant, reply) for (tenant, _), reply
                       in zip(((t, h) for t in wanted for h in hours), replies, strict=True)]
        for tenant, fields in buckets:
            for name, value in fields.items():
                text = name.decode() if isinstance(name, bytes) else name
                key_id, model, kind = text.split(SEPARATOR, 2)
                if kind not in KINDS:
                    continue
                row = rows.get((tenant, key_id, model))
                if row is None:
                    row = rows[(tenant, key_id, model)] = UsageRow(tenant, key_id, model)
                row.add(kind, int(value))
        return sorted(rows.values(), key=lambda r: (r.tenant, r.model, r.key_id))


def totals(rows: Iterable[UsageRow]) -> UsageRow:
    total = UsageRow("*", "*", "*")
    for row in rows:
        for kind in KINDS:
            total.add(kind, getattr(row, kind))
    return total

"""Hot-path authentication: API key -> tenant, from an in-process cache.

The cache holds each key's record and tenant for ``ttl_s``; a Redis pub/sub channel drops
entries the moment a key is created or revoked or a tenant changes, on every replica. When the
subscription breaks, the whole cache is dropped on reconnect, so no revocation is ever missed for
longer than the reconnect takes. Without Redis (a single replica keeping its state in memory)
the store calls ``invalidate`` itself on every change, so there is nothing to listen to.

A ``sy-`` key is cached under its key id. An imported key without one is cached under its digest
and found through the store's digest index; both then take the same checks: the digest compared
in constant time, revocation, expiry, the tenant.

**No crypto per request.** The first request with a key computes its digest (HMAC-SHA256 under
``key_secret``) and compares it in constant time; the entry then remembers the key that
matched, and later requests compare the presented key with it in constant time
(``hmac.compare_digest``, ~0.1 µs, against ~8 µs for the HMAC). An entry is replaced, never
updated, when it expires or is invalidated, so a revoked key is verified afresh from the
store's record. Revocation, expiry and the tenant are checked on every request. At most
``max_entries`` entries are kept (the oldest dropped first): keys that do not exist are cached
too, so that a flood of them costs one Redis lookup each and bounded memory.

Example::

    auth = Authenticator(store, redis, ttl_s=30)
    principal = await auth.authenticate(request.headers.get("Authorization"))
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TypeVar

import redis.asyncio as aioredis

from backends.redis_url import REDIS_ERRORS
from gateway.errors import APIError
from gateway.keystore import INVALIDATION_CHANNEL
from gateway.tenancy import ApiKey, KeyStoreLike, Tenant, is_imported_shape, parse_key

log = logging.getLogger(__name__)
V = TypeVar("V")

_MALFORMED = (
    "Malformed API key. switchyard keys look like 'sy-<16 hex>-<43 characters>'; "
    "send it as 'Authorization: Bearer <key>' (or as 'x-api-key: <key>')."
)
_NO_SUCH_KEY = "Invalid API key: no such key. Check for a typo."
_NO_SUCH_IMPORTED_KEY = (
    "Invalid API key: no such key. switchyard keys look like 'sy-<16 hex>-<43 characters>' "
    "unless the operator imported them; check for a typo."
)


@dataclass(slots=True, init=False)
class Principal:
    """Who is calling: the tenant and the key used."""

    tenant: Tenant
    key: ApiKey

    def __init__(self, tenant: Tenant, key: ApiKey) -> None:
        self.tenant = tenant
        self.key = key

    @property
    def tier(self) -> str:
        return self.key.tier or self.tenant.tier


@dataclass(slots=True)
class _Entry:
    key: ApiKey | None
    tenant: Tenant | None
    fetched_at: float
    verified: str | None = None  # the presented key whose digest matched ``key.digest``


class Authenticator:
    def __init__(self, store: KeyStoreLike, redis: aioredis.Redis | None, *,
                 ttl_s: float = 30.0, max_entries: int = 100_000) -> None:
        self._store = store
        self._redis = redis
        self._ttl_s = ttl_s
        self._max_entries = max_entries
        self.num_digests = 0  # digests computed: once per key per entry, not per request
        self._imported_digests: dict[str, str] = {}  # imported keys verified: key -> digest
        self._cache: dict[str, _Entry] = {}
        self._inflight: dict[str, asyncio.Future[_Entry]] = {}
        self.is_subscribed = False

    @property
    def num_cached(self) -> int:
        """Keys (and key ids that do not exist) in the cache."""
        return len(self._cache)

    async def authenticate(self, authorization: str | None) -> Principal:
        if not authorization:
            raise APIError.unauthorized(
                "Missing API key. Send 'Authorization: Bearer sy-...' (or Anthropic's "
                "'x-api-key: sy-...') with a key from 'switchyard keys create'.",
                code="missing_api_key",
            )
        scheme, _, presented = authorization.partition(" ")
        if scheme.lower() != "bearer" or not presented:
            raise APIError.unauthorized(_MALFORMED)
        presented = presented.strip()
        parsed = parse_key(presented)
        digest: str | None = None
        if parsed is not None:
            cache_key = parsed[0]
        elif is_imported_shape(presented):
            digest = self._imported_digests.get(presented)
            if digest is None:
                digest = self._store.digest(presented)
                self.num_digests += 1
            cache_key = digest
        else:
            raise APIError.unauthorized(_MALFORMED)
        now = time.monotonic()
        entry = self._cache.get(cache_key)
        if entry is None or now - entry.fetched_at > self._ttl_s:
            entry = await self._fetch(cache_key, entry, by_digest=digest is not None)
        key, tenant = entry.key, entry.tenant
        verified = entry.verified
        if key is None or verified is None or not hmac.compare_digest(presented, verified):
            # Compare digests in constant time even for unknown keys: timing reveals nothing.
            expected = key.digest if key else "0" * 64
            if digest is None:
                digest = self._store.digest(presented)
                self.num_digests += 1
            if not hmac.compare_digest(digest, expected) or key is None:
                raise APIError.unauthorized(_NO_SUCH_KEY if parsed else _NO_SUCH_IMPORTED_KEY)
            entry.verified = presented
            if parsed is None:  # its digest is its cache key: remember it (a pure function)
                _put_bounded(self._imported_digests, presented, digest, self._max_entries)
        if key.is_revoked():
            raise APIError.unauthorized("This API key has been revoked.", code="revoked_api_key")
        if key.is_expired(time.time()):
            raise APIError.unauthorized("This API key has expired.", code="expired_api_key")
        if tenant is None:
            raise APIError.unauthorized("Invalid API key: its tenant no longer exists.")
        if not tenant.enabled:
            raise APIError.forbidden(
                f"Tenant {tenant.id!r} is disabled; ask the operator to enable it.",
                code="tenant_disabled",
            )
        return Principal(tenant=tenant, key=key)

    async def _fetch(self, cache_key: str, stale: _Entry | None, *, by_digest: bool) -> _Entry:
        pending = self._inflight.get(cache_key)
        if pending is not None:  # single flight: one Redis fetch per key however many wait
            return await asyncio.shield(pending)
        future: asyncio.Future[_Entry] = asyncio.get_running_loop().create_future()
        self._inflight[cache_key] = future
        try:
            if by_digest:
                key, tenant = await self._store.lookup_digest(cache_key)
            else:
                key, tenant = await self._store.lookup(cache_key)
        except REDIS_ERRORS as exc:
            if stale is not None:
                # never log a digest: without key_secret it is the key's bare SHA-256
                label = stale.key.id if stale.key else "(unknown)" if by_digest else cache_key
                log.warning("key store unreachable, serving cached key %s: %s", label, exc)
                future.set_result(stale)
                return stale
            error = APIError.unavailable(
                "The key store (Redis) is unreachable and this key is not in the gateway's "
                "cache, so it cannot be checked; retry shortly.", code="key_store_unavailable")
            future.set_exception(error)
            future.exception()  # mark retrieved
            raise error from exc
        finally:
            self._inflight.pop(cache_key, None)
        entry = _Entry(key=key, tenant=tenant, fetched_at=time.monotonic())
        _put_bounded(self._cache, cache_key, entry, self._max_entries)
        future.set_result(entry)
        return entry

    def invalidate(self, message: str) -> None:
        kind, _, ident = message.partition(" ")
        if kind in ("key", "digest"):  # a key id, or an imported key's digest
            self._cache.pop(ident, None)
        elif kind == "tenant":
            for key_id in [k for k, e in self._cache.items() if e.key and e.key.tenant_id == ident]:
                del self._cache[key_id]
        else:
            self._cache.clear()
            self._imported_digests.clear()

    async def listen_for_invalidations(self) -> None:
        """Run until cancelled: apply invalidation messages; reconnect with backoff."""
        if self._redis is None:
            raise RuntimeError("no Redis to listen to: the key store calls invalidate() itself")
        delay_s = 0.1
        while True:
            pubsub = self._redis.pubsub(ignore_subscribe_messages=True)
            # No await in an except or finally block of a compiled module
            # (tests/routing/test_native.py): the pubsub closes after the ``try``.
            stopped: BaseException | None = None
            try:
                await pubsub.subscribe(INVALIDATION_CHANNEL)
                self._cache.clear()  # anything may have changed while we were not listening
                self.is_subscribed = True
                delay_s = 0.1
                async for message in pubsub.listen():
                    if message.get("type") == "message":
                        data = message["data"]
                        self.invalidate(data.decode() if isinstance(data, bytes) else str(data))
            except REDIS_ERRORS as exc:
                log.warning("auth invalidation channel lost (%s); reconnecting", exc)
            except BaseException as stop:  # cancelled
                stopped = stop
            await self._unsubscribed(pubsub)
            if stopped is not None:
                raise stopped
            await asyncio.sleep(delay_s)
            delay_s = min(delay_s * 2, 2.0)

    async def _unsubscribed(self, pubsub: aioredis.client.PubSub) -> None:
        self.is_subscribed = False
        with contextlib.suppress(Exception):
            await pubsub.aclose()  # type: ignore[no-untyped-call,unused-ignore]


def credentials(headers: Mapping[str, str]) -> str | None:
    """The request's ``Authorization`` header, or, from Anthropic's clients, its
    ``x-api-key`` as a bearer token."""
    authorization = headers.get("Authorization")
    if authorization is None:
        key = headers.get("x-api-key")
        if key is not None:
            return "Bearer " + key
    return authorization


def _put_bounded(mapping: dict[str, V], key: str, value: V, max_entries: int) -> None:
    """Store ``value`` as the newest entry of ``mapping``, dropping the oldest beyond
    ``max_entries`` (dicts keep insertion order)."""
    mapping.pop(key, None)
    while len(mapping) >= max_entries:
        del mapping[next(iter(mapping))]
    mapping[key] = value

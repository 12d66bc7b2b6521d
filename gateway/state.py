"""Where the gateway keeps tenants, keys and quotas: Redis, or this process (``settings.state``).

With ``state: redis`` every replica shares them through Redis: the key store, the key cache's
invalidations over pub/sub and the quota scripts. With ``state: memory`` the same interfaces are
served from this process (``MemoryKeyStore``, ``MemoryQuotaStore``): a single replica, exact
limits, no Redis connection at all, and tenants and keys gone when the process exits.

Example::

    state = open_state(settings)
    ...  # serve, with state.store, state.auth and state.quotas
    await state.aclose()
"""

from __future__ import annotations

import logging
import secrets
from dataclasses import dataclass

import redis.asyncio as aioredis

from admission.quota.memory import MemoryQuotaStore
from admission.quota.store import QuotaStore
from admission.quota.types import QuotaStoreLike
from backends.redis_url import redis_from_url
from gateway.auth import Authenticator
from gateway.keystore import KeyStore
from gateway.keystore_memory import MemoryKeyStore
from gateway.settings import Settings
from gateway.tenancy import KeyStoreLike

log = logging.getLogger(__name__)

MEMORY_WARNING = (
    "state in memory: a single replica; tenants, keys and quotas live in this process and "
    "tenants and keys are lost at exit; use --redis-url (state: redis) for several replicas"
)


@dataclass(slots=True)
class GatewayState:
    """The key store, the key cache in front of it and the quota store; ``redis`` is None
    when the state is in memory."""

    redis: aioredis.Redis | None
    store: KeyStoreLike
    auth: Authenticator
    quotas: QuotaStoreLike

    async def aclose(self) -> None:
        await self.quotas.aclose()  # the last requests' settles go out first
        if self.redis is not None:
            await self.redis.aclose()


def open_state(settings: Settings) -> GatewayState:
    """The state ``settings.state`` names; opens no connection yet (Redis connects lazily)."""
    secret = settings.key_secret.get_secret_value().encode() if settings.key_secret else None
    admission = settings.admission
    if settings.state == "memory":
        log.warning(MEMORY_WARNING)
        # Keys die with the process, so a random per-process secret costs nothing.
        memory_store = MemoryKeyStore(secret or secrets.token_bytes(32))
        auth = Authenticator(memory_store, None, ttl_s=settings.key_cache_ttl_s)
        memory_store.subscribe(auth.invalidate)  # revocation is seen by the next request
        return GatewayState(redis=None, store=memory_store, auth=auth,
                            quotas=MemoryQuotaStore(lease_ttl_s=admission.lease_ttl_s))
    redis = redis_from_url(
        settings.redis_url, socket_timeout=2.0, socket_connect_timeout=2.0,
        health_check_interval=10,
    )
    if secret is None:
        log.warning("no key_secret configured: API keys are hashed with plain SHA-256; set "
                    "key_secret (SWITCHYARD_KEY_SECRET), the same on every replica")
    store = KeyStore(redis, secret)
    return GatewayState(
        redis=redis, store=store, auth=Authenticator(store, redis, ttl_s=settings.key_cache_ttl_s),
        quotas=QuotaStore(redis, lease_ttl_s=admission.lease_ttl_s,
                          fail_mode=admission.fail_mode, timeout_s=admission.redis_timeout_s,
                          block_s=admission.quota_block_s),
    )

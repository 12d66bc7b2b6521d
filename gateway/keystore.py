"""Tenants and API keys, stored in Redis (schema in docs/redis.md).

The records, key formats and the checks on imported keys live in ``gateway.tenancy``; this is
the store every replica shares. An imported key without an embedded id is found through a
digest index (digest -> key id). Every change is published on ``sy:events:auth`` so each
replica's key cache drops what changed.

Example::

    store = KeyStore(redis, key_secret=b"...")
    tenant = await store.create_tenant(name="acme", tier="standard", models=["*"])
    record, plaintext = await store.create_key(tenant.id)   # plaintext is shown once
    imported = await store.import_key(tenant.id, "sk-...")   # after imported_key_problem()
"""

from __future__ import annotations

import time
from dataclasses import asdict, replace
from typing import Any

import orjson
import redis.asyncio as aioredis

from gateway.tenancy import (
    ALL_MODELS,
    TENANT_ID_RE,
    ApiKey,
    KeyStoreLike,
    Limits,
    Tenant,
    check_weight,
    entropy_bits,
    imported_key_problem,
    imported_key_record,
    is_imported_shape,
    key_digest,
    mint_key,
    new_tenant,
    parse_key,
    weight_problem,
)

__all__ = [
    "ALL_MODELS", "INVALIDATION_CHANNEL", "TENANT_ID_RE", "ApiKey", "KeyStore", "KeyStoreLike",
    "Limits", "Tenant", "entropy_bits", "imported_key_problem", "is_imported_shape",
    "parse_key", "weight_problem",
]

KEY_PREFIX = "sy"
INVALIDATION_CHANNEL = "sy:events:auth"


def tenant_key(tenant_id: str) -> str:
    return f"{KEY_PREFIX}:tenant:{{{tenant_id}}}"


def tenant_keys_key(tenant_id: str) -> str:
    return f"{KEY_PREFIX}:tenant:{{{tenant_id}}}:keys"


def api_key_key(key_id: str) -> str:
    return f"{KEY_PREFIX}:apikey:{{{key_id}}}"


def key_digest_key(digest: str) -> str:
    return f"{KEY_PREFIX}:apikey-digest:{{{digest}}}"


TENANTS_SET = f"{KEY_PREFIX}:tenants"


class KeyStore:
    """CRUD for tenants and keys. Not on the hot path except on a key-cache miss."""

    def __init__(self, redis: aioredis.Redis, key_secret: bytes | None) -> None:
        self._redis = redis
        self._key_secret = key_secret

    def digest(self, presented_key: str) -> str:
        return key_digest(self._key_secret, presented_key)

    # -- tenants -----------------------------------------------------------------------
    async def create_tenant(
        self,
        *,
        name: str,
        tier: str,
        models: list[str],
        limits: Limits | None = None,
        tenant_id: str | None = None,
        enabled: bool = True,
        weight: float = 1.0,
    ) -> Tenant:
        tenant = new_tenant(name=name, tier=tier, models=models, limits=limits,
                            tenant_id=tenant_id, enabled=enabled, weight=weight)
        created = await self._redis.hsetnx(tenant_key(tenant.id), "doc", _dump_tenant(tenant))
        if not created:
            raise KeyError(tenant.id)
        await self._redis.sadd(TENANTS_SET, tenant.id)
        return tenant

    async def get_tenant(self, tenant_id: str) -> Tenant | None:
        raw = await self._redis.hget(tenant_key(tenant_id), "doc")
        return _load_tenant(raw) if raw else None

    async def list_tenants(self) -> list[Tenant]:
        ids = sorted(await self._redis.smembers(TENANTS_SET))
        if not ids:
            return []
        async with self._redis.pipeline(transaction=False) as pipe:
            for tid in ids:
                pipe.hget(tenant_key(_text(tid)), "doc")
            docs = await pipe.execute()
        return [_load_tenant(doc) for doc in docs if doc]

    async def update_tenant(self, tenant_id: str, **changes: Any) -> Tenant | None:
        if "weight" in changes:
            check_weight(changes["weight"])
        current = await self.get_tenant(tenant_id)
        if current is None:
            return None
        if "models" in changes:
            changes["models"] = tuple(changes["models"])
        updated = replace(current, **changes)
        await self._redis.hset(tenant_key(tenant_id), "doc", _dump_tenant(updated))
        await self._redis.publish(INVALIDATION_CHANNEL, f"tenant {tenant_id}")
        return updated

    # -- keys --------------------------------------------------------------------------
    async def create_key(
        self,
        tenant_id: str,
        *,
        name: str = "",
        expires_at: float | None = None,
        tier: str | None = None,
    ) -> tuple[ApiKey, str]:
        record, plaintext = mint_key(tenant_id, digest=self.digest, name=name,
                                     expires_at=expires_at, tier=tier)
        key_id = record.id
        # The tenant's index first, then the record: a failure between them leaves an id that
        # names no key (listing skips it), never a key its tenant does not list. No MULTI: the
        # two sit in different hash slots, which a Redis Cluster refuses in one transaction.
        await self._redis.sadd(tenant_keys_key(tenant_id), key_id)
        await self._redis.hset(api_key_key(key_id), "doc", _dump_key(record))
        await self._redis.publish(INVALIDATION_CHANNEL, f"key {key_id}")
        return record, plaintext

    async def import_key(
        self,
        tenant_id: str,
        plaintext: str,
        *,
        name: str = "",
        expires_at: float | None = None,
        tier: str | None = None,
    ) -> ApiKey:
        """Store an operator-supplied key, checked first with ``imported_key_problem``.

        Raises KeyError with the id of the key already stored when the key (or, for a key in
        the ``sy-`` shape, its id) is taken.
        """
        parsed = parse_key(plaintext)
        record = imported_key_record(tenant_id, plaintext, digest=self.digest, name=name,
                                     expires_at=expires_at, tier=tier)
        key_id, digest = record.id, record.digest
        index = key_digest_key(digest)
        if parsed is None and not await self._redis.set(index, key_id, nx=True):
            raise KeyError(_text(await self._redis.get(index) or b"?"))
        if not await self._redis.hsetnx(api_key_key(key_id), "doc", _dump_key(record)):
            if parsed is None:
                await self._redis.delete(index)
            raise KeyError(key_id)
        # Not a transaction (the keys span slots); the record is already stored.
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.sadd(tenant_keys_key(tenant_id), key_id)
            pipe.publish(INVALIDATION_CHANNEL, f"key {key_id}")
            pipe.publish(INVALIDATION_CHANNEL, f"digest {digest}")  # a cached "no such key"
            await pipe.execute()
        return record

    async def get_key(self, key_id: str) -> ApiKey | None:
        raw = await self._redis.hget(api_key_key(key_id), "doc")
        return _load_key(raw) if raw else None

    async def list_keys(self, tenant_id: str) -> list[ApiKey]:
        ids = sorted(await self._redis.smembers(tenant_keys_key(tenant_id)))
        if not ids:
            return []
        async with self._redis.pipeline(transaction=False) as pipe:
            for kid in ids:
                pipe.hget(api_key_key(_text(kid)), "doc")
            docs = await pipe.execute()
        return [_load_key(doc) for doc in docs if doc]

    async def revoke_key(self, key_id: str) -> ApiKey | None:
        record = await self.get_key(key_id)
        if record is None:
            return None
        if record.revoked_at is None:
            record = replace(record, revoked_at=time.time())
            await self._redis.hset(api_key_key(key_id), "doc", _dump_key(record))
        await self._redis.publish(INVALIDATION_CHANNEL, f"key {key_id}")
        if record.imported:  # caches may hold it under its digest
            await self._redis.publish(INVALIDATION_CHANNEL, f"digest {record.digest}")
        return record

    async def lookup(self, key_id: str) -> tuple[ApiKey | None, Tenant | None]:
        """The hot path's cache-miss fetch: the key record and its tenant."""
        key = await self.get_key(key_id)
        if key is None:
            return None, None
        return key, await self.get_tenant(key.tenant_id)

    async def lookup_digest(self, digest: str) -> tuple[ApiKey | None, Tenant | None]:
        """``lookup`` for an imported key without an id: through the digest index."""
        key_id = await self._redis.get(key_digest_key(digest))
        if key_id is None:
            return None, None
        return await self.lookup(_text(key_id))


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _dump_tenant(tenant: Tenant) -> bytes:
    return orjson.dumps(asdict(tenant))


def _load_tenant(raw: bytes | str) -> Tenant:
    data = orjson.loads(raw)
    data["models"] = tuple(data["models"])
    data["limits"] = Limits(**data["limits"])
    data.setdefault("weight", 1.0)  # stored before tenants had weights
    return Tenant(**data)


def _dump_key(key: ApiKey) -> bytes:
    return orjson.dumps(asdict(key))


def _load_key(raw: bytes | str) -> ApiKey:
    return ApiKey(**orjson.loads(raw))

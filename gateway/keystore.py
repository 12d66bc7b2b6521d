"""Tenants and API keys, stored in Redis (schema in docs/redis.md).

A key looks like ``sy-<key id>-<secret>``: the key id (16 hex characters) finds the record in
O(1); the secret (32 random bytes, base64url) is never stored, only the HMAC-SHA256 of the whole
key under the server's ``key_secret`` (or its SHA-256 when no secret is configured).

Example::

    store = KeyStore(redis, key_secret=b"...")
    tenant = await store.create_tenant(name="acme", tier="standard", models=["*"])
    record, plaintext = await store.create_key(tenant.id)   # plaintext is shown once
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import time
from dataclasses import asdict, dataclass, replace
from typing import Any

import orjson
import redis.asyncio as aioredis

KEY_PREFIX = "sy"
INVALIDATION_CHANNEL = "sy:events:auth"
ALL_MODELS = "*"

_KEY_RE = re.compile(r"^sy-([0-9a-f]{16})-([A-Za-z0-9_-]{43})$")
TENANT_ID_RE = re.compile(r"^[a-z0-9][a-z0-9_-]{0,62}$")


@dataclass(frozen=True, slots=True)
class Limits:
    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None
    max_concurrent: int | None = None


@dataclass(frozen=True, slots=True)
class Tenant:
    id: str
    name: str
    tier: str
    models: tuple[str, ...]
    limits: Limits
    enabled: bool
    created_at: float

    def may_use(self, model: str) -> bool:
        return ALL_MODELS in self.models or model in self.models

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["models"] = list(self.models)
        data["object"] = "tenant"
        return data


@dataclass(frozen=True, slots=True)
class ApiKey:
    id: str
    tenant_id: str
    name: str
    digest: str
    hint: str
    created_at: float
    expires_at: float | None
    revoked_at: float | None
    tier: str | None

    def is_revoked(self) -> bool:
        return self.revoked_at is not None

    def is_expired(self, now: float) -> bool:
        return self.expires_at is not None and now >= self.expires_at

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        del data["digest"]
        data["object"] = "api_key"
        return data


def parse_key(presented: str) -> tuple[str, str] | None:
    """Split ``sy-<id>-<secret>`` into (key id, secret), or None when malformed."""
    match = _KEY_RE.match(presented)
    return (match.group(1), match.group(2)) if match else None


def tenant_key(tenant_id: str) -> str:
    return f"{KEY_PREFIX}:tenant:{{{tenant_id}}}"


def tenant_keys_key(tenant_id: str) -> str:
    return f"{KEY_PREFIX}:tenant:{{{tenant_id}}}:keys"


def api_key_key(key_id: str) -> str:
    return f"{KEY_PREFIX}:apikey:{{{key_id}}}"


TENANTS_SET = f"{KEY_PREFIX}:tenants"


class KeyStore:
    """CRUD for tenants and keys. Not on the hot path except on a key-cache miss."""

    def __init__(self, redis: aioredis.Redis, key_secret: bytes | None) -> None:
        self._redis = redis
        self._key_secret = key_secret

    def digest(self, presented_key: str) -> str:
        data = presented_key.encode()
        if self._key_secret:
            return hmac.digest(self._key_secret, data, "sha256").hex()  # one-shot C path
        return hashlib.sha256(data).hexdigest()

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
    ) -> Tenant:
        tenant = Tenant(
            id=tenant_id or f"t-{secrets.token_hex(6)}",
            name=name,
            tier=tier,
            models=tuple(models),
            limits=limits or Limits(),
            enabled=enabled,
            created_at=time.time(),
        )
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
        key_id = secrets.token_hex(8)
        plaintext = f"sy-{key_id}-{secrets.token_urlsafe(32)}"
        record = ApiKey(
            id=key_id,
            tenant_id=tenant_id,
            name=name,
            digest=self.digest(plaintext),
            hint=f"sy-{key_id}-...{plaintext[-4:]}",
            created_at=time.time(),
            expires_at=expires_at,
            revoked_at=None,
            tier=tier,
        )
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.hset(api_key_key(key_id), "doc", _dump_key(record))
            pipe.sadd(tenant_keys_key(tenant_id), key_id)
            pipe.publish(INVALIDATION_CHANNEL, f"key {key_id}")
            await pipe.execute()
        return record, plaintext

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
        return record

    async def lookup(self, key_id: str) -> tuple[ApiKey | None, Tenant | None]:
        """The hot path's cache-miss fetch: the key record and its tenant."""
        key = await self.get_key(key_id)
        if key is None:
            return None, None
        return key, await self.get_tenant(key.tenant_id)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _dump_tenant(tenant: Tenant) -> bytes:
    return orjson.dumps(asdict(tenant))


def _load_tenant(raw: bytes | str) -> Tenant:
    data = orjson.loads(raw)
    data["models"] = tuple(data["models"])
    data["limits"] = Limits(**data["limits"])
    return Tenant(**data)


def _dump_key(key: ApiKey) -> bytes:
    return orjson.dumps(asdict(key))


def _load_key(raw: bytes | str) -> ApiKey:
    return ApiKey(**orjson.loads(raw))

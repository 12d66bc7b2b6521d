"""Tenants and API keys, stored in Redis (schema in docs/redis.md).

A key looks like ``sy-<key id>-<secret>``: the key id (16 hex characters) finds the record in
O(1); the secret (32 random bytes, base64url) is never stored, only the HMAC-SHA256 of the whole
key under the server's ``key_secret`` (or its SHA-256 when no secret is configured).

An imported key (an operator-supplied string, kept by clients moving from another gateway) is
stored the same way. One in the ``sy-`` shape keeps its embedded id; any other has no id to
parse, so a digest index (digest -> key id) finds its record.

Example::

    store = KeyStore(redis, key_secret=b"...")
    tenant = await store.create_tenant(name="acme", tier="standard", models=["*"])
    record, plaintext = await store.create_key(tenant.id)   # plaintext is shown once
    imported = await store.import_key(tenant.id, "sk-...")   # after imported_key_problem()
"""

from __future__ import annotations

import hashlib
import hmac
import itertools
import math
import re
import secrets
import time
from collections import Counter
from dataclasses import asdict, dataclass, replace
from typing import Any

import orjson
import redis.asyncio as aioredis

KEY_PREFIX = "sy"
INVALIDATION_CHANNEL = "sy:events:auth"
ALL_MODELS = "*"

_KEY_RE = re.compile(r"^sy-([0-9a-f]{16})-([A-Za-z0-9_-]{43})$")
TENANT_ID_RE = re.compile(r"^[a-z0-9][a-z0-9_-]{0,62}$")

MIN_WEIGHT = 0.001  # a smaller weight drives finish tags so high that float precision is lost
MAX_WEIGHT = 1000.0
MIN_IMPORTED_KEY_CHARS = 20
MAX_IMPORTED_KEY_CHARS = 256
MIN_IMPORTED_KEY_BITS = 80
_IMPORTED_SHAPE_RE = re.compile(
    rf"^[\x21-\x7e]{{{MIN_IMPORTED_KEY_CHARS},{MAX_IMPORTED_KEY_CHARS}}}$")


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
    weight: float = 1.0  # share of its tier's queue, relative to the tier's other tenants

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
    imported: bool = False

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


def weight_problem(weight: object) -> str | None:
    """Why ``weight`` cannot be a tenant's weight, or None when it can."""
    if isinstance(weight, bool) or not isinstance(weight, int | float):
        got = f"got {type(weight).__name__}"
    elif not (math.isfinite(weight) and MIN_WEIGHT <= weight <= MAX_WEIGHT):
        got = f"got {weight}"
    else:
        return None
    return (f"must be a number from {MIN_WEIGHT:g} to {MAX_WEIGHT:g} ({got}); the default is 1, "
            "and a tenant of weight 2 gets twice the queue share of a tenant of weight 1")


def is_imported_shape(presented: str) -> bool:
    """Whether ``presented`` could be an imported key: cheap enough for every request."""
    return not presented.startswith("sy-") and _IMPORTED_SHAPE_RE.match(presented) is not None


def imported_key_problem(key: str) -> str | None:
    """Why ``key`` may not be imported, or None when it may. The message never quotes the key."""
    if any(c.isspace() for c in key):
        return ("contains whitespace (a space, tab or line break); send the key alone, "
                "without a trailing newline")
    if not all("\x21" <= c <= "\x7e" for c in key):
        return "may hold only printable ASCII characters (letters, digits and punctuation)"
    if len(key) < MIN_IMPORTED_KEY_CHARS:
        return f"is {len(key)} characters long; it needs at least {MIN_IMPORTED_KEY_CHARS}"
    if len(key) > MAX_IMPORTED_KEY_CHARS:
        return f"is {len(key)} characters long; it may have at most {MAX_IMPORTED_KEY_CHARS}"
    parsed = parse_key(key)
    if key.startswith("sy-") and parsed is None:
        return ("starts with 'sy-' but is not a switchyard key ('sy-<16 hex>-<43 characters>'); "
                "the gateway reads every 'sy-' key in that shape")
    material = parsed[1] if parsed else key  # a switchyard key's id is not secret
    steps = [ord(b) - ord(a) for a, b in itertools.pairwise(material)]
    if not any(steps):
        return "is one character repeated; import a random key"
    if sum(abs(step) <= 1 for step in steps) * 2 >= len(steps):
        return ("is mostly a run of neighbouring characters (like 'abcd' or '1234'); "
                "import a random key")
    num_trigrams = len(material) - 2
    if len({material[i:i + 3] for i in range(num_trigrams)}) < 0.75 * num_trigrams:
        return "repeats parts of itself (like 'abc1abc1'); import a random key"
    bits = entropy_bits(material)
    if bits < MIN_IMPORTED_KEY_BITS:
        return (f"looks guessable: its characters carry about {bits:.0f} bits by a Shannon "
                f"estimate, and at least {MIN_IMPORTED_KEY_BITS} are needed; import a longer "
                "random key (a random key of 32 characters or more passes)")
    return None


def entropy_bits(text: str) -> float:
    """Shannon entropy of ``text``'s character frequencies times its length, in bits."""
    counts = Counter(text).values()
    return -sum(n * math.log2(n / len(text)) for n in counts)


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
        weight: float = 1.0,
    ) -> Tenant:
        _check_weight(weight)
        tenant = Tenant(
            id=tenant_id or f"t-{secrets.token_hex(6)}",
            name=name,
            tier=tier,
            models=tuple(models),
            limits=limits or Limits(),
            enabled=enabled,
            created_at=time.time(),
            weight=weight,
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
        if "weight" in changes:
            _check_weight(changes["weight"])
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
        key_id = parsed[0] if parsed else secrets.token_hex(8)
        digest = self.digest(plaintext)
        record = ApiKey(
            id=key_id,
            tenant_id=tenant_id,
            name=name,
            digest=digest,
            hint=f"sy-{key_id}-...{plaintext[-4:]}" if parsed else f"...{plaintext[-4:]}",
            created_at=time.time(),
            expires_at=expires_at,
            revoked_at=None,
            tier=tier,
            imported=True,
        )
        index = key_digest_key(digest)
        if parsed is None and not await self._redis.set(index, key_id, nx=True):
            raise KeyError(_text(await self._redis.get(index) or b"?"))
        if not await self._redis.hsetnx(api_key_key(key_id), "doc", _dump_key(record)):
            if parsed is None:
                await self._redis.delete(index)
            raise KeyError(key_id)
        async with self._redis.pipeline(transaction=True) as pipe:
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


def _check_weight(weight: object) -> None:
    problem = weight_problem(weight)
    if problem is not None:
        raise ValueError(f"weight {problem}")


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

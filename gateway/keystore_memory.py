"""Tenants and API keys in this process: the key store of a single replica without Redis.

Same contract as ``gateway.keystore.KeyStore`` (the records, digests, KeyError / ValueError and
ordering of ``gateway.tenancy.KeyStoreLike``), with everything lost when the process exits.
Instead of publishing invalidations on a Redis channel, every change is handed at once to the
callbacks given to ``subscribe`` (the ``Authenticator``'s ``invalidate``), so a revoked key is
refused by the very next request.

Example::

    store = MemoryKeyStore(key_secret=secrets.token_bytes(32))
    store.subscribe(auth.invalidate)
    tenant = await store.create_tenant(name="acme", tier="standard", models=["*"])
    record, plaintext = await store.create_key(tenant.id)   # plaintext is shown once
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from gateway.tenancy import (
    ApiKey,
    Limits,
    Tenant,
    check_weight,
    imported_key_record,
    key_digest,
    mint_key,
    new_tenant,
    parse_key,
)


class MemoryKeyStore:
    """Tenants, keys and the digest index in dictionaries; see the module docstring."""

    def __init__(self, key_secret: bytes | None) -> None:
        self._key_secret = key_secret
        self._tenants: dict[str, Tenant] = {}
        self._keys: dict[str, ApiKey] = {}
        self._tenant_keys: dict[str, set[str]] = {}
        self._digest_index: dict[str, str] = {}  # imported keys without an id: digest -> key id
        self._listeners: list[Callable[[str], None]] = []

    def subscribe(self, listener: Callable[[str], None]) -> None:
        """Call ``listener`` with each invalidation (``"key <id>"``, ``"digest <digest>"``,
        ``"tenant <id>"``): the messages the Redis store publishes."""
        self._listeners.append(listener)

    def _publish(self, message: str) -> None:
        for listener in self._listeners:
            listener(message)

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
        if tenant.id in self._tenants:
            raise KeyError(tenant.id)
        self._tenants[tenant.id] = tenant
        return tenant

    async def get_tenant(self, tenant_id: str) -> Tenant | None:
        return self._tenants.get(tenant_id)

    async def list_tenants(self) -> list[Tenant]:
        return [self._tenants[tid] for tid in sorted(self._tenants)]

    async def update_tenant(self, tenant_id: str, **changes: Any) -> Tenant | None:
        if "weight" in changes:
            check_weight(changes["weight"])
        current = self._tenants.get(tenant_id)
        if current is None:
            return None
        if "models" in changes:
            changes["models"] = tuple(changes["models"])
        updated = replace(current, **changes)
        self._tenants[tenant_id] = updated
        self._publish(f"tenant {tenant_id}")
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
        self._keys[record.id] = record
        self._tenant_keys.setdefault(tenant_id, set()).add(record.id)
        self._publish(f"key {record.id}")
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
        has_id = parse_key(plaintext) is not None
        record = imported_key_record(tenant_id, plaintext, digest=self.digest, name=name,
                                     expires_at=expires_at, tier=tier)
        if not has_id and record.digest in self._digest_index:
            raise KeyError(self._digest_index[record.digest])
        if record.id in self._keys:
            raise KeyError(record.id)
        if not has_id:
            self._digest_index[record.digest] = record.id
        self._keys[record.id] = record
        self._tenant_keys.setdefault(tenant_id, set()).add(record.id)
        self._publish(f"key {record.id}")
        self._publish(f"digest {record.digest}")  # a cached "no such key"
        return record

    async def get_key(self, key_id: str) -> ApiKey | None:
        return self._keys.get(key_id)

    async def list_keys(self, tenant_id: str) -> list[ApiKey]:
        return [self._keys[kid] for kid in sorted(self._tenant_keys.get(tenant_id, ()))]

    async def revoke_key(self, key_id: str) -> ApiKey | None:
        record = self._keys.get(key_id)
        if record is None:
            return None
        if record.revoked_at is None:
            record = replace(record, revoked_at=time.time())
            self._keys[key_id] = record
        self._publish(f"key {key_id}")
        if record.imported:  # caches may hold it under its digest
            self._publish(f"digest {record.digest}")
        return record

    async def lookup(self, key_id: str) -> tuple[ApiKey | None, Tenant | None]:
        """The key record and its tenant, as the key cache fetches them on a miss."""
        key = self._keys.get(key_id)
        if key is None:
            return None, None
        return key, self._tenants.get(key.tenant_id)

    async def lookup_digest(self, digest: str) -> tuple[ApiKey | None, Tenant | None]:
        """``lookup`` for an imported key without an id: through the digest index."""
        key_id = self._digest_index.get(digest)
        if key_id is None:
            return None, None
        return await self.lookup(key_id)

"""The key cache: one digest per key, not per request; revocation still immediate; bounded.

A real ``Authenticator`` over the in-process key store (``MemoryKeyStore``, the store of a
single replica without Redis), which hands every change to ``Authenticator.invalidate`` as the
Redis channel does for replicas (that path: ``tests/gateway/test_keys.py``).
"""

from __future__ import annotations

import secrets

import pytest

from gateway.auth import Authenticator
from gateway.errors import APIError
from gateway.keystore_memory import MemoryKeyStore


async def setup(max_entries: int = 100_000) -> tuple[MemoryKeyStore, Authenticator, str, str]:
    store = MemoryKeyStore(key_secret=secrets.token_bytes(32))
    auth = Authenticator(store, None, ttl_s=30.0, max_entries=max_entries)
    store.subscribe(auth.invalidate)
    tenant = await store.create_tenant(name="acme", tier="standard", models=["*"])
    record, plaintext = await store.create_key(tenant.id)
    return store, auth, record.id, plaintext


async def refused(auth: Authenticator, key: str) -> APIError:
    with pytest.raises(APIError) as caught:
        await auth.authenticate(f"Bearer {key}")
    assert caught.value.status == 401
    return caught.value


async def test_a_cached_key_costs_one_digest_for_many_requests() -> None:
    _, auth, key_id, plaintext = await setup()
    for _ in range(1_000):
        principal = await auth.authenticate(f"Bearer {plaintext}")
        assert principal.key.id == key_id
    assert auth.num_digests == 1


async def test_a_wrong_secret_for_a_cached_key_id_is_refused_and_the_key_still_works() -> None:
    _, auth, key_id, plaintext = await setup()
    await auth.authenticate(f"Bearer {plaintext}")
    prefix, _, secret = plaintext.rpartition("-")
    forged = f"{prefix}-{'A' if secret[0] != 'A' else 'B'}{secret[1:]}"
    error = await refused(auth, forged)
    assert error.code == "invalid_api_key"
    assert auth.num_digests == 2  # the forgery was checked against the stored digest
    assert (await auth.authenticate(f"Bearer {plaintext}")).key.id == key_id


async def test_a_revoked_key_is_refused_by_the_next_request() -> None:
    store, auth, key_id, plaintext = await setup()
    for _ in range(3):
        await auth.authenticate(f"Bearer {plaintext}")
    await store.revoke_key(key_id)
    error = await refused(auth, plaintext)
    assert error.code == "revoked_api_key"


async def test_a_disabled_tenant_is_refused_by_the_next_request() -> None:
    store, auth, _, plaintext = await setup()
    principal = await auth.authenticate(f"Bearer {plaintext}")
    await store.update_tenant(principal.tenant.id, enabled=False)
    with pytest.raises(APIError) as caught:
        await auth.authenticate(f"Bearer {plaintext}")
    assert caught.value.status == 403 and caught.value.code == "tenant_disabled"


async def test_an_imported_key_costs_one_digest_and_is_revoked_at_once() -> None:
    store, auth, _, _ = await setup()
    tenant = (await store.list_tenants())[0]
    imported = secrets.token_urlsafe(32)
    record = await store.import_key(tenant.id, imported)
    for _ in range(100):
        assert (await auth.authenticate(f"Bearer {imported}")).key.id == record.id
    assert auth.num_digests == 1
    await store.revoke_key(record.id)
    error = await refused(auth, imported)
    assert error.code == "revoked_api_key"


async def test_unknown_keys_are_refused_and_the_cache_stays_bounded() -> None:
    _, auth, key_id, plaintext = await setup(max_entries=64)
    for index in range(500):
        error = await refused(auth, f"sy-{index:016x}-{secrets.token_urlsafe(32)[:43]}")
        assert error.code == "invalid_api_key"
        assert auth.num_cached <= 64
    assert (await auth.authenticate(f"Bearer {plaintext}")).key.id == key_id

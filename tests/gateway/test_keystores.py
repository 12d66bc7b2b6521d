"""The two key stores keep one contract: ``KeyStore`` on a private redis-server and
``MemoryKeyStore`` in process, the same calls and the same answers, errors and invalidations."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import pytest
import redis.asyncio as aioredis

from gateway.keystore import INVALIDATION_CHANNEL, KeyStore
from gateway.keystore_memory import MemoryKeyStore
from gateway.tenancy import KeyStoreLike, Limits, parse_key

SECRET = b"contract-test-secret"
IMPORTED = "sk-Zq8vR2mXw4Lp9TfK1bNc7HdY3sJe6GuA"  # no sy- id: found through its digest
IMPORTED_SY = "sy-00112233aabbccdd-" + "Kf3Jq9Xw2Lm8Rt6Vb1Nc5Hd7Ys4Ge0Ua2Pi9Oz3Lk8w"


@dataclass
class Subject:
    store: KeyStoreLike
    messages: Callable[[], asyncio.Future[list[str]]]  # the invalidations seen so far


@pytest.fixture(params=["redis", "memory"])
async def subject(request: pytest.FixtureRequest, redis_url: str) -> AsyncIterator[Subject]:
    if request.param == "memory":
        memory = MemoryKeyStore(SECRET)
        seen: list[str] = []
        memory.subscribe(seen.append)

        def memory_messages() -> asyncio.Future[list[str]]:
            future = asyncio.get_running_loop().create_future()
            future.set_result(list(seen))
            return future

        yield Subject(memory, memory_messages)
        return
    client = aioredis.Redis.from_url(redis_url.rsplit("/", 1)[0] + "/11")
    await client.flushdb()
    pubsub = client.pubsub(ignore_subscribe_messages=True)
    await pubsub.subscribe(INVALIDATION_CHANNEL)
    heard: list[str] = []

    async def listen() -> None:
        async for message in pubsub.listen():
            heard.append(message["data"].decode())

    listener = asyncio.create_task(listen())

    async def settle() -> list[str]:
        await client.publish(INVALIDATION_CHANNEL, "end")  # everything before it has arrived
        while "end" not in heard:
            await asyncio.sleep(0.005)
        heard.remove("end")
        return list(heard)

    try:
        yield Subject(KeyStore(client, SECRET), lambda: asyncio.ensure_future(settle()))
    finally:
        listener.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await listener
        await pubsub.aclose()  # type: ignore[no-untyped-call]
        await client.flushdb()
        await client.aclose()


async def test_tenants_create_get_list_update(subject: Subject) -> None:
    store = subject.store
    limits = Limits(requests_per_minute=5, max_concurrent=2)
    acme = await store.create_tenant(name="Acme", tier="standard", models=["m1", "m2"],
                                     limits=limits, tenant_id="acme", weight=2.0)
    assert (acme.id, acme.models, acme.limits, acme.weight, acme.enabled) == (
        "acme", ("m1", "m2"), limits, 2.0, True)
    assert abs(acme.created_at - time.time()) < 5
    generated = await store.create_tenant(name="Other", tier="batch", models=["*"])
    assert generated.id.startswith("t-") and generated.limits == Limits()
    assert await store.get_tenant("acme") == acme
    assert await store.get_tenant("nope") is None
    assert [t.id for t in await store.list_tenants()] == sorted(["acme", generated.id])
    updated = await store.update_tenant("acme", models=["m3"], enabled=False, weight=0.5)
    assert updated is not None and updated.models == ("m3",) and not updated.enabled
    assert await store.get_tenant("acme") == updated
    assert await store.update_tenant("nope", enabled=False) is None


@pytest.mark.parametrize(
    ("call", "error"),
    [
        pytest.param("duplicate-id", KeyError, id="duplicate-id"),
        pytest.param("create-weight", ValueError, id="create-bad-weight"),
        pytest.param("update-weight", ValueError, id="update-bad-weight"),
    ],
)
async def test_tenant_errors(subject: Subject, call: str, error: type[Exception]) -> None:
    store = subject.store
    await store.create_tenant(name="A", tier="standard", models=["*"], tenant_id="a")
    with pytest.raises(error) as info:
        if call == "duplicate-id":
            await store.create_tenant(name="B", tier="batch", models=["*"], tenant_id="a")
        elif call == "create-weight":
            await store.create_tenant(name="B", tier="batch", models=["*"], weight=0)
        else:
            await store.update_tenant("a", weight=5000)
    if error is KeyError:
        assert info.value.args == ("a",)
    stored = await store.get_tenant("a")
    assert stored is not None and stored.name == "A" and stored.weight == 1.0


async def test_keys_create_get_list_lookup(subject: Subject) -> None:
    store = subject.store
    tenant = await store.create_tenant(name="A", tier="standard", models=["*"], tenant_id="a")
    record, plaintext = await store.create_key("a", name="ci", tier="batch")
    parsed = parse_key(plaintext)
    assert parsed is not None and parsed[0] == record.id
    assert record.digest == hmac.new(SECRET, plaintext.encode(), hashlib.sha256).hexdigest()
    assert record.digest == store.digest(plaintext)
    assert record.hint == f"sy-{record.id}-...{plaintext[-4:]}"
    assert (record.name, record.tier, record.imported, record.revoked_at) == (
        "ci", "batch", False, None)
    second, _ = await store.create_key("a")
    assert await store.get_key(record.id) == record
    assert await store.get_key("0000000000000000") is None
    assert [k.id for k in await store.list_keys("a")] == sorted([record.id, second.id])
    assert await store.list_keys("nobody") == []
    assert await store.lookup(record.id) == (record, tenant)
    assert await store.lookup("0000000000000000") == (None, None)
    assert await store.lookup_digest(record.digest) == (None, None)  # not an imported key


async def test_imported_keys(subject: Subject) -> None:
    store = subject.store
    tenant = await store.create_tenant(name="A", tier="standard", models=["*"], tenant_id="a")
    plain = await store.import_key("a", IMPORTED, name="old")
    assert plain.imported and plain.hint == f"...{IMPORTED[-4:]}"
    assert plain.digest == store.digest(IMPORTED)
    assert await store.lookup_digest(plain.digest) == (plain, tenant)
    shaped = await store.import_key("a", IMPORTED_SY)
    assert shaped.id == "00112233aabbccdd"
    assert shaped.hint == f"sy-{shaped.id}-...{IMPORTED_SY[-4:]}"
    assert await store.lookup(shaped.id) == (shaped, tenant)
    with pytest.raises(KeyError) as same_key:
        await store.import_key("a", IMPORTED)
    assert same_key.value.args == (plain.id,)
    with pytest.raises(KeyError) as same_id:
        await store.import_key("a", IMPORTED_SY[:-1] + "X")
    assert same_id.value.args == (shaped.id,)
    assert sorted(k.id for k in await store.list_keys("a")) == sorted([plain.id, shaped.id])


async def test_revocation_is_kept_and_idempotent(subject: Subject) -> None:
    store = subject.store
    await store.create_tenant(name="A", tier="standard", models=["*"], tenant_id="a")
    record, _ = await store.create_key("a")
    revoked = await store.revoke_key(record.id)
    assert revoked is not None and revoked.revoked_at is not None and revoked.is_revoked()
    again = await store.revoke_key(record.id)
    assert again is not None and again.revoked_at == revoked.revoked_at
    assert await store.get_key(record.id) == revoked
    assert await store.revoke_key("0000000000000000") is None


async def test_the_same_changes_send_the_same_invalidations(subject: Subject) -> None:
    store = subject.store
    await store.create_tenant(name="A", tier="standard", models=["*"], tenant_id="a")
    record, _ = await store.create_key("a")
    imported = await store.import_key("a", IMPORTED)
    await store.update_tenant("a", enabled=False)
    await store.revoke_key(record.id)
    await store.revoke_key(imported.id)
    assert await subject.messages() == [
        f"key {record.id}", f"key {imported.id}", f"digest {imported.digest}", "tenant a",
        f"key {record.id}", f"key {imported.id}", f"digest {imported.digest}",
    ]


@pytest.mark.parametrize("store_kind", ["redis", "memory"])
async def test_without_a_secret_the_digest_is_plain_sha256(store_kind: str) -> None:
    store: KeyStoreLike = (MemoryKeyStore(None) if store_kind == "memory"
                           else KeyStore(aioredis.Redis(), None))  # digest() does no I/O
    assert store.digest("sy-x") == hashlib.sha256(b"sy-x").hexdigest()

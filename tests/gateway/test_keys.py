"""API keys and tenants end to end: storage, revocation across gateways, expiry, isolation."""

from __future__ import annotations

import hashlib
import hmac
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import redis

from gateway.cli.localproc import ProcessGroup
from tests.fleet import ADMIN_TOKEN, KEY_SECRET, MODEL, Engine, Gateway

KEY_RE = re.compile(r"^sy-([0-9a-f]{16})-([A-Za-z0-9_-]{43})$")


@pytest.fixture(scope="module")
def gateway_2(
    procs: ProcessGroup, workdir: Path, redis_url: str, engines: list[Engine], gateway: Gateway
) -> Iterator[Gateway]:
    """A second gateway on the same Redis, as a second replica would be."""
    second = Gateway(procs, workdir, redis_url, [e.backend_config() for e in engines])
    yield second
    second.terminate()
    second.process.wait(timeout=10)


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def list_models(gw: Gateway, key: str) -> httpx.Response:
    return httpx.get(gw.url + "/v1/models", headers=bearer(key), timeout=5)


def chat(gw: Gateway, key: str, model: str = MODEL) -> httpx.Response:
    return httpx.post(
        gw.url + "/v1/chat/completions", headers=bearer(key), timeout=10,
        json={"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
    )


def create_key_record(gw: Gateway, tenant_id: str, **fields: Any) -> dict[str, Any]:
    response = gw.admin.post("/admin/keys", json={"tenant_id": tenant_id, **fields})
    assert response.status_code == 201, response.text
    return dict(response.json())


def assert_error(response: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["code"] == code, error
    assert error["message"]
    assert response.headers["x-request-id"]
    return dict(error)


def poll_status(gw: Gateway, key: str, status: int, timeout_s: float) -> float:
    """Seconds until a request with ``key`` gets ``status`` (fails the test after timeout_s)."""
    started = time.monotonic()
    while True:
        got = list_models(gw, key).status_code
        elapsed = time.monotonic() - started
        if got == status:
            return elapsed
        assert elapsed < timeout_s, f"still {got} after {elapsed:.2f} s, expected {status}"
        time.sleep(0.01)


# -- storage ----------------------------------------------------------------------------------


def redis_values(client: Any, name: bytes) -> list[bytes]:  # redis-py types are loose
    """Every byte string stored under ``name``, whatever its type."""
    kind = client.type(name).decode()
    if kind == "string":
        return [client.get(name) or b""]
    if kind == "hash":
        return [part for pair in client.hgetall(name).items() for part in pair]
    if kind == "set":
        return list(client.smembers(name))
    if kind == "list":
        return list(client.lrange(name, 0, -1))
    if kind == "zset":
        return [member for member, _ in client.zrange(name, 0, -1, withscores=True)]
    if kind == "stream":
        return [
            part
            for _, fields in client.xrange(name)
            for pair in fields.items()
            for part in pair
        ]
    if kind == "none":  # expired between SCAN and TYPE
        return []
    raise AssertionError(f"unexpected Redis type {kind!r} under {name!r}: teach this test it")


def test_redis_never_holds_a_plaintext_key(gateway: Gateway, redis_url: str) -> None:
    tenant = gateway.create_tenant()
    records = [create_key_record(gateway, tenant["id"], name=f"k{i}") for i in range(4)]
    records.append(create_key_record(gateway, tenant["id"], tier="batch", expires_in_s=3600))
    plaintexts = [r["key"] for r in records]
    secrets = [KEY_RE.match(p).group(2) for p in plaintexts]  # type: ignore[union-attr]
    # Any 8 consecutive characters of a secret count as a leak; the 4-character hint does not.
    needles = {p.encode() for p in plaintexts}
    needles |= {s[i:i + 8].encode() for s in secrets for i in range(len(s) - 7)}

    client = redis.Redis.from_url(redis_url)
    blobs: list[bytes] = []
    for name in client.scan_iter(count=1000):
        blobs.append(name)
        blobs.extend(redis_values(client, name))
    client.close()
    everything = b"\n".join(blobs)

    leaks = sorted(n.decode() for n in needles if n in everything)
    assert not leaks, f"key material found in Redis: {leaks[:3]}"
    # The scan did see the keys: each is stored as its id and HMAC digest under key_secret.
    for record, plaintext in zip(records, plaintexts, strict=True):
        digest = hmac.new(KEY_SECRET.encode(), plaintext.encode(), hashlib.sha256).hexdigest()
        assert record["id"].encode() in everything
        assert digest.encode() in everything
        assert hashlib.sha256(plaintext.encode()).hexdigest().encode() not in everything


def test_keys_have_the_documented_shape_and_differ(gateway: Gateway) -> None:
    tenant = gateway.create_tenant()
    first, second = (create_key_record(gateway, tenant["id"]) for _ in range(2))
    for record in (first, second):
        match = KEY_RE.match(record["key"])
        assert match, record["key"]
        assert match.group(1) == record["id"]
        assert record["hint"] == f"sy-{record['id']}-...{record['key'][-4:]}"
    assert first["key"] != second["key"]
    assert first["id"] != second["id"]
    assert KEY_RE.match(first["key"]).group(2) != KEY_RE.match(second["key"]).group(2)  # type: ignore[union-attr]


# -- revocation and invalidation across replicas --------------------------------------------


def revoke_key(gw: Gateway, tenant_id: str, key_id: str) -> None:
    assert gw.admin.delete(f"/admin/keys/{key_id}").status_code == 200


def disable_tenant(gw: Gateway, tenant_id: str, key_id: str) -> None:
    assert gw.admin.delete(f"/admin/tenants/{tenant_id}").status_code == 200


def patch_disabled(gw: Gateway, tenant_id: str, key_id: str) -> None:
    response = gw.admin.patch(f"/admin/tenants/{tenant_id}", json={"enabled": False})
    assert response.status_code == 200


@pytest.mark.parametrize(
    ("change", "status", "code"),
    [
        pytest.param(revoke_key, 401, "revoked_api_key", id="revoke-key"),
        pytest.param(disable_tenant, 403, "tenant_disabled", id="disable-tenant"),
        pytest.param(patch_disabled, 403, "tenant_disabled", id="patch-enabled-false"),
    ],
)
def test_change_on_one_gateway_is_seen_by_another_within_1s(
    gateway: Gateway, gateway_2: Gateway, change: Callable[[Gateway, str, str], None],
    status: int, code: str,
) -> None:
    tenant = gateway.create_tenant()
    record = create_key_record(gateway, tenant["id"])
    key = record["key"]
    # Both gateways accept the key first, so both have it cached (for 30 s by default).
    assert list_models(gateway, key).status_code == 200
    assert list_models(gateway_2, key).status_code == 200
    assert chat(gateway_2, key).status_code == 200

    started = time.monotonic()
    change(gateway, tenant["id"], record["id"])
    poll_status(gateway_2, key, status, timeout_s=1.0)
    assert time.monotonic() - started < 1.0
    poll_status(gateway, key, status, timeout_s=1.0)
    assert_error(list_models(gateway_2, key), status, code)
    assert_error(chat(gateway_2, key), status, code)


def test_reenabled_tenant_works_again_on_both_gateways(
    gateway: Gateway, gateway_2: Gateway
) -> None:
    tenant = gateway.create_tenant()
    key = gateway.create_key(tenant["id"])
    assert list_models(gateway_2, key).status_code == 200
    assert gateway.admin.delete(f"/admin/tenants/{tenant['id']}").status_code == 200
    poll_status(gateway_2, key, 403, timeout_s=1.0)
    response = gateway_2.admin.patch(f"/admin/tenants/{tenant['id']}", json={"enabled": True})
    assert response.status_code == 200
    poll_status(gateway, key, 200, timeout_s=1.0)
    poll_status(gateway_2, key, 200, timeout_s=1.0)


# -- key and tenant states --------------------------------------------------------------------


def expired_key(gw: Gateway) -> str:
    record = create_key_record(gw, gw.create_tenant()["id"], expires_in_s=0.3)
    assert list_models(gw, record["key"]).status_code == 200  # cached while still valid
    time.sleep(0.35)
    return str(record["key"])


def already_expired_key(gw: Gateway) -> str:
    record = create_key_record(gw, gw.create_tenant()["id"], expires_at=time.time() - 60)
    return str(record["key"])


def revoked_key(gw: Gateway) -> str:
    record = create_key_record(gw, gw.create_tenant()["id"])
    assert list_models(gw, record["key"]).status_code == 200
    revoke_key(gw, "", record["id"])
    poll_status(gw, record["key"], 401, timeout_s=1.0)
    return str(record["key"])


def key_of_disabled_tenant(gw: Gateway) -> str:
    tenant = gw.create_tenant()
    key = gw.create_key(tenant["id"])
    assert list_models(gw, key).status_code == 200
    disable_tenant(gw, tenant["id"], "")
    poll_status(gw, key, 403, timeout_s=1.0)
    return key


def key_of_tenant_created_disabled(gw: Gateway) -> str:
    return gw.create_key(gw.create_tenant(enabled=False)["id"])


def unknown_well_formed_key(gw: Gateway) -> str:
    return "sy-0123456789abcdef-" + "A" * 43


def forged_secret_for_real_id(gw: Gateway) -> str:
    record = create_key_record(gw, gw.create_tenant()["id"])
    secret = record["key"][-43:]
    forged = secret[:-1] + ("B" if secret[-1] != "B" else "C")
    return f"sy-{record['id']}-{forged}"


@pytest.mark.parametrize(
    ("make_key", "status", "code"),
    [
        pytest.param(expired_key, 401, "expired_api_key", id="expired"),
        pytest.param(already_expired_key, 401, "expired_api_key", id="expires-at-in-past"),
        pytest.param(revoked_key, 401, "revoked_api_key", id="revoked"),
        pytest.param(key_of_disabled_tenant, 403, "tenant_disabled", id="disabled-tenant"),
        pytest.param(key_of_tenant_created_disabled, 403, "tenant_disabled",
                     id="tenant-created-disabled"),
        pytest.param(unknown_well_formed_key, 401, "invalid_api_key", id="unknown-key"),
        pytest.param(forged_secret_for_real_id, 401, "invalid_api_key", id="wrong-secret"),
    ],
)
def test_unusable_keys_are_refused(
    gateway: Gateway, make_key: Callable[[Gateway], str], status: int, code: str
) -> None:
    key = make_key(gateway)
    assert_error(list_models(gateway, key), status, code)
    error = assert_error(chat(gateway, key), status, code)
    assert error["type"] == ("authentication_error" if status == 401 else "permission_error")
    client = openai.OpenAI(base_url=gateway.url + "/v1", api_key=key, max_retries=0)
    expected = openai.AuthenticationError if status == 401 else openai.PermissionDeniedError
    with pytest.raises(expected) as info:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}])
    assert info.value.code == code


# -- tenant isolation -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tenant_keys(gateway: Gateway) -> dict[str, str]:
    return {
        "model-a": gateway.new_key(models=["model-a"]),
        "model-b": gateway.new_key(models=["model-b"]),
    }


@pytest.mark.parametrize(
    ("own", "other"),
    [pytest.param("model-a", "model-b", id="tenant-a"),
     pytest.param("model-b", "model-a", id="tenant-b")],
)
def test_tenant_sees_and_uses_only_its_models(
    gateway: Gateway, tenant_keys: dict[str, str], own: str, other: str
) -> None:
    client = openai.OpenAI(base_url=gateway.url + "/v1", api_key=tenant_keys[own], max_retries=0)
    assert [m.id for m in client.models.list()] == [own]
    assert client.models.retrieve(own).id == own
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve(other)
    completion = client.chat.completions.create(
        model=own, messages=[{"role": "user", "content": "a b"}], max_tokens=2
    )
    assert completion.choices[0].message.content
    with pytest.raises(openai.PermissionDeniedError) as info:
        client.chat.completions.create(model=other, messages=[{"role": "user", "content": "x"}])
    assert info.value.code == "model_not_allowed"
    assert info.value.param == "model"
    with pytest.raises(openai.PermissionDeniedError):
        client.completions.create(model=MODEL, prompt="x")  # served, but not this tenant's


# -- the admin API is not for tenants ---------------------------------------------------------

ADMIN_CALLS = [
    pytest.param("GET", "/admin/tenants", None, id="list-tenants"),
    pytest.param("POST", "/admin/tenants", {"name": "x"}, id="create-tenant"),
    pytest.param("PATCH", "/admin/tenants/t-x", {"enabled": True}, id="update-tenant"),
    pytest.param("DELETE", "/admin/tenants/t-x", None, id="disable-tenant"),
    pytest.param("GET", "/admin/keys", None, id="list-keys"),
    pytest.param("POST", "/admin/keys", {"tenant_id": "t-x"}, id="create-key"),
    pytest.param("DELETE", "/admin/keys/0123456789abcdef", None, id="revoke-key"),
]

ADMIN_CREDENTIALS = [
    pytest.param("tenant-key", 403, "not_admin", id="tenant-key"),
    pytest.param(None, 401, "invalid_admin_token", id="missing"),
    pytest.param("Bearer wrong-token", 401, "invalid_admin_token", id="wrong-token"),
    pytest.param(f"Basic {ADMIN_TOKEN}", 401, "invalid_admin_token", id="right-token-wrong-scheme"),
    pytest.param(f"Bearer {ADMIN_TOKEN}x", 401, "invalid_admin_token", id="token-with-suffix"),
    pytest.param(f"Bearer {ADMIN_TOKEN[:-1]}", 401, "invalid_admin_token", id="token-prefix"),
]


@pytest.mark.parametrize(("authorization", "status", "code"), ADMIN_CREDENTIALS)
@pytest.mark.parametrize(("method", "path", "body"), ADMIN_CALLS)
def test_admin_api_needs_the_admin_token(
    gateway: Gateway, api_key: str, method: str, path: str, body: Any,
    authorization: str | None, status: int, code: str,
) -> None:
    headers = {}
    if authorization == "tenant-key":
        headers["Authorization"] = f"Bearer {api_key}"
    elif authorization is not None:
        headers["Authorization"] = authorization
    response = httpx.request(method, gateway.url + path, json=body, headers=headers, timeout=5)
    error = assert_error(response, status, code)
    assert ADMIN_TOKEN not in response.text
    assert api_key not in response.text
    assert error["type"] == ("permission_error" if status == 403 else "authentication_error")

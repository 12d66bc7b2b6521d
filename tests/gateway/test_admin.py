"""The admin API over HTTP (the CLI over it: test_admin_cli.py)."""

from __future__ import annotations

import json
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import redis

from tests.fleet import Gateway

SWITCHYARD = str(Path(sys.executable).parent / "switchyard")


def new_id() -> str:
    return f"t-{uuid.uuid4().hex[:10]}"


def assert_error(response: httpx.Response, status: int, param: str | None = None) -> str:
    """Check an OpenAI-format error; return its message."""
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["param"] == param, error
    assert error["message"]
    return str(error["message"])


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def models_status(gw: Gateway, key: str) -> int:
    return httpx.get(gw.url + "/v1/models", headers=bearer(key), timeout=5).status_code


def wait_for_status(gw: Gateway, key: str, status: int, timeout_s: float = 1.0) -> None:
    deadline = time.monotonic() + timeout_s
    while (got := models_status(gw, key)) != status:
        assert time.monotonic() < deadline, f"still {got}, expected {status}"
        time.sleep(0.01)


# -- tenants ----------------------------------------------------------------------------------


def test_create_tenant_with_defaults(gateway: Gateway) -> None:
    tenant_id = new_id()
    response = gateway.admin.post("/admin/tenants", json={"id": tenant_id, "name": "Acme"})
    assert response.status_code == 201, response.text
    tenant = response.json()
    assert tenant["object"] == "tenant"
    assert tenant["id"] == tenant_id
    assert tenant["name"] == "Acme"
    assert tenant["tier"] == "standard"
    assert tenant["models"] == ["*"]
    assert tenant["enabled"] is True
    assert tenant["weight"] == 1.0
    assert tenant["limits"] == {
        "requests_per_minute": None, "tokens_per_minute": None, "max_concurrent": None,
    }
    assert abs(tenant["created_at"] - time.time()) < 60


def test_create_tenant_with_every_field_and_generated_id(gateway: Gateway) -> None:
    body = {
        "name": "Batchy", "tier": "batch", "models": ["model-a", "model-b"],
        "limits": {"requests_per_minute": 60, "tokens_per_minute": 1000, "max_concurrent": 2},
        "enabled": False, "weight": 2.5,
    }
    response = gateway.admin.post("/admin/tenants", json=body)
    assert response.status_code == 201, response.text
    tenant = response.json()
    assert tenant["id"].startswith("t-")
    assert {k: tenant[k] for k in body} == body
    assert gateway.admin.get(f"/admin/tenants/{tenant['id']}").json() == tenant


def test_duplicate_tenant_id_conflicts(gateway: Gateway) -> None:
    tenant = gateway.create_tenant(name="first")
    response = gateway.admin.post("/admin/tenants", json={"id": tenant["id"], "name": "second"})
    message = assert_error(response, 409)
    assert response.json()["error"]["code"] == "conflict"
    assert tenant["id"] in message
    assert gateway.admin.get(f"/admin/tenants/{tenant['id']}").json()["name"] == "first"


@pytest.mark.parametrize(
    ("body", "param", "needle"),
    [
        pytest.param({"name": "x", "tier": "gold"}, "tier", "interactive, standard, batch",
                     id="unknown-tier"),
        pytest.param({}, "name", "required", id="missing-name"),
        pytest.param({"name": ""}, "name", "at least 1", id="empty-name"),
        pytest.param({"name": 5}, "name", "string", id="name-not-string"),
        pytest.param({"name": "x", "id": "Upper Case"}, "id", "pattern", id="bad-id"),
        pytest.param({"name": "x", "models": "model-a"}, "models", "array", id="models-not-list"),
        pytest.param({"name": "x", "models": [1]}, "models.0", "string", id="model-not-string"),
        pytest.param({"name": "x", "limits": {"requests_per_minute": 0}},
                     "limits.requests_per_minute", "greater than", id="limit-zero"),
        pytest.param({"name": "x", "limits": {"rpm": 5}}, "limits.rpm", "not permitted",
                     id="unknown-limit"),
        pytest.param({"name": "x", "enabled": "maybe"}, "enabled", "boolean",
                     id="enabled-not-bool"),
        pytest.param({"name": "x", "colour": "blue"}, "colour", "not permitted",
                     id="unknown-field"),
        pytest.param({"name": "x", "weight": 0}, "weight", "0.001 to 1000", id="weight-zero"),
        pytest.param({"name": "x", "weight": -2}, "weight", "0.001 to 1000",
                     id="weight-negative"),
        pytest.param({"name": "x", "weight": 1e9}, "weight", "0.001 to 1000", id="weight-huge"),
        pytest.param({"name": "x", "weight": 0.0001}, "weight", "0.001 to 1000",
                     id="weight-tiny"),
        pytest.param(b'{"name": "x", "weight": NaN}', "weight", "0.001 to 1000",
                     id="weight-nan"),
        pytest.param(b'{"name": "x", "weight": Infinity}', "weight", "0.001 to 1000",
                     id="weight-infinite"),
        pytest.param({"name": "x", "weight": "heavy"}, "weight", "must be a number",
                     id="weight-string"),
        pytest.param({"name": "x", "weight": "2"}, "weight", "must be a number",
                     id="weight-numeric-string"),
        pytest.param({"name": "x", "weight": True}, "weight", "must be a number",
                     id="weight-bool"),
        pytest.param({"name": "x", "weight": [2]}, "weight", "must be a number",
                     id="weight-list"),
        pytest.param([], None, "object", id="body-is-array"),
        pytest.param(b"{bad json", None, "JSON", id="malformed-json"),
        pytest.param(b"", None, "JSON", id="empty-body"),
    ],
)
def test_create_tenant_rejects_bad_bodies(
    gateway: Gateway, body: Any, param: str | None, needle: str
) -> None:
    if isinstance(body, bytes):
        response = gateway.admin.post("/admin/tenants", content=body)
    else:
        response = gateway.admin.post("/admin/tenants", json=body)
    message = assert_error(response, 400, param)
    assert needle.lower() in message.lower()
    if param:
        assert param in message


def test_list_tenants_includes_created_ones(gateway: Gateway) -> None:
    created = [gateway.create_tenant(name=f"listed {i}") for i in range(3)]
    response = gateway.admin.get("/admin/tenants")
    assert response.status_code == 200
    listing = response.json()
    assert listing["object"] == "list"
    by_id = {t["id"]: t for t in listing["data"]}
    for tenant in created:
        assert by_id[tenant["id"]] == tenant


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        pytest.param("GET", "/admin/tenants/t-nope", None, id="get"),
        pytest.param("PATCH", "/admin/tenants/t-nope", {"name": "x"}, id="update"),
        pytest.param("DELETE", "/admin/tenants/t-nope", None, id="disable"),
        pytest.param("POST", "/admin/keys", {"tenant_id": "t-nope"}, id="create-key"),
    ],
)
def test_unknown_tenant_is_404(gateway: Gateway, method: str, path: str, body: Any) -> None:
    response = gateway.admin.request(method, path, json=body)
    assert "t-nope" in assert_error(response, 404, "tenant_id")


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        pytest.param({"name": "renamed"}, {"name": "renamed"}, id="name"),
        pytest.param({"tier": "interactive"}, {"tier": "interactive"}, id="tier"),
        pytest.param({"models": ["model-b"]}, {"models": ["model-b"]}, id="models"),
        pytest.param({"limits": {"max_concurrent": 3}},
                     {"limits": {"requests_per_minute": None, "tokens_per_minute": None,
                                 "max_concurrent": 3}}, id="limits"),
        pytest.param({"enabled": False}, {"enabled": False}, id="disable"),
        pytest.param({"weight": 4}, {"weight": 4.0}, id="weight"),
        pytest.param({"weight": 0.001}, {"weight": 0.001}, id="smallest-weight"),
        pytest.param({"weight": 1000}, {"weight": 1000.0}, id="largest-weight"),
        pytest.param({}, {}, id="nothing"),
    ],
)
def test_update_tenant(gateway: Gateway, change: dict[str, Any], expected: dict[str, Any]) -> None:
    tenant = gateway.create_tenant(models=["model-a"], name="before",
                                   limits={"requests_per_minute": 10})
    response = gateway.admin.patch(f"/admin/tenants/{tenant['id']}", json=change)
    assert response.status_code == 200, response.text
    assert response.json() == {**tenant, **expected}
    assert gateway.admin.get(f"/admin/tenants/{tenant['id']}").json() == {**tenant, **expected}


@pytest.mark.parametrize(
    ("change", "param"),
    [
        pytest.param({"tier": "gold"}, "tier", id="unknown-tier"),
        pytest.param({"name": ""}, "name", id="empty-name"),
        pytest.param({"limits": {"tokens_per_minute": -1}}, "limits.tokens_per_minute",
                     id="negative-limit"),
        pytest.param({"id": "t-other"}, "id", id="id-is-immutable"),
        pytest.param({"models": None}, "models", id="null-models"),
        pytest.param({"name": None}, "name", id="null-name"),
        pytest.param({"tier": None}, "tier", id="null-tier"),
        pytest.param({"enabled": None}, "enabled", id="null-enabled"),
        pytest.param({"weight": None}, "weight", id="null-weight"),
        pytest.param({"weight": 0}, "weight", id="zero-weight"),
        pytest.param({"weight": 1000.5}, "weight", id="weight-over-1000"),
        pytest.param({"weight": "x"}, "weight", id="weight-not-number"),
    ],
)
def test_update_tenant_rejects_bad_changes(
    gateway: Gateway, change: dict[str, Any], param: str
) -> None:
    tenant = gateway.create_tenant()
    response = gateway.admin.patch(f"/admin/tenants/{tenant['id']}", json=change)
    assert param in assert_error(response, 400, param)
    assert gateway.admin.get(f"/admin/tenants/{tenant['id']}").json() == tenant


def test_tenant_stored_before_weights_loads_with_weight_1(
    gateway: Gateway, redis_url: str
) -> None:
    tenant_id = new_id()
    doc = {"id": tenant_id, "name": "from before weights", "tier": "batch", "models": ["*"],
           "limits": {"requests_per_minute": None, "tokens_per_minute": None,
                      "max_concurrent": None},
           "enabled": True, "created_at": 1_700_000_000.0}
    client = redis.Redis.from_url(redis_url)
    client.hset(f"sy:tenant:{{{tenant_id}}}", "doc", json.dumps(doc))
    client.sadd("sy:tenants", tenant_id)

    expected = {**doc, "weight": 1.0, "object": "tenant"}
    assert gateway.admin.get(f"/admin/tenants/{tenant_id}").json() == expected
    listed = {t["id"]: t for t in gateway.admin.get("/admin/tenants").json()["data"]}
    assert listed[tenant_id] == expected
    assert models_status(gateway, gateway.create_key(tenant_id)) == 200

    response = gateway.admin.patch(f"/admin/tenants/{tenant_id}", json={"weight": 3})
    assert response.json() == {**expected, "weight": 3.0}
    stored = json.loads(client.hget(f"sy:tenant:{{{tenant_id}}}", "doc") or b"{}")
    client.close()
    assert stored == {**doc, "weight": 3.0}


def test_update_models_takes_effect_for_existing_keys(gateway: Gateway) -> None:
    tenant = gateway.create_tenant(models=["model-a"])
    key = gateway.create_key(tenant["id"])
    client = openai.OpenAI(base_url=gateway.url + "/v1", api_key=key, max_retries=0)
    assert [m.id for m in client.models.list()] == ["model-a"]
    response = gateway.admin.patch(f"/admin/tenants/{tenant['id']}", json={"models": ["model-b"]})
    assert response.status_code == 200
    deadline = time.monotonic() + 1.0
    while [m.id for m in client.models.list()] != ["model-b"]:
        assert time.monotonic() < deadline, "the model change was not seen within 1 s"
        time.sleep(0.01)
    with pytest.raises(openai.PermissionDeniedError):
        client.chat.completions.create(model="model-a", messages=[{"role": "user", "content": "x"}])


def test_disable_tenant_stops_its_keys(gateway: Gateway) -> None:
    tenant = gateway.create_tenant()
    key = gateway.create_key(tenant["id"])
    assert models_status(gateway, key) == 200
    response = gateway.admin.delete(f"/admin/tenants/{tenant['id']}")
    assert response.status_code == 200
    assert response.json() == {**tenant, "enabled": False}
    assert gateway.admin.get(f"/admin/tenants/{tenant['id']}").json()["enabled"] is False
    wait_for_status(gateway, key, 403)


# -- keys -------------------------------------------------------------------------------------


def create_key(gw: Gateway, tenant_id: str, **fields: Any) -> dict[str, Any]:
    response = gw.admin.post("/admin/keys", json={"tenant_id": tenant_id, **fields})
    assert response.status_code == 201, response.text
    return dict(response.json())


def test_create_key(gateway: Gateway) -> None:
    tenant = gateway.create_tenant()
    before = time.time()
    record = create_key(gateway, tenant["id"], name="laptop", expires_in_s=3600)
    assert record["object"] == "api_key"
    assert record["tenant_id"] == tenant["id"]
    assert record["name"] == "laptop"
    assert record["key"].startswith(f"sy-{record['id']}-")
    assert record["revoked_at"] is None
    assert record["tier"] is None
    assert before + 3600 <= record["expires_at"] <= time.time() + 3600
    assert "digest" not in record
    assert models_status(gateway, record["key"]) == 200


def assert_no_secrets(text: str, data: Any, plaintexts: list[str]) -> None:
    for plaintext in plaintexts:
        assert plaintext not in text
        assert plaintext[-43:] not in text
    records = data if isinstance(data, list) else [data]
    for record in records:
        assert "digest" not in record
        assert "key" not in record


def test_list_and_get_keys_never_show_digest_or_plaintext(gateway: Gateway) -> None:
    tenant, other = gateway.create_tenant(), gateway.create_tenant()
    records = [create_key(gateway, tenant["id"], name=f"k{i}") for i in range(3)]
    other_record = create_key(gateway, other["id"])
    plaintexts = [r["key"] for r in [*records, other_record]]
    expected = {r["id"]: {k: v for k, v in r.items() if k != "key"} for r in records}

    response = gateway.admin.get("/admin/keys", params={"tenant_id": tenant["id"]})
    assert response.status_code == 200
    listing = response.json()
    assert listing["object"] == "list"
    assert_no_secrets(response.text, listing["data"], plaintexts)
    assert {k["id"]: k for k in listing["data"]} == expected

    everything = gateway.admin.get("/admin/keys")
    assert everything.status_code == 200
    assert_no_secrets(everything.text, everything.json()["data"], plaintexts)
    listed_ids = {k["id"] for k in everything.json()["data"]}
    assert {r["id"] for r in [*records, other_record]} <= listed_ids

    for record in records:
        got = gateway.admin.get(f"/admin/keys/{record['id']}")
        assert got.status_code == 200
        assert_no_secrets(got.text, got.json(), plaintexts)
        assert got.json() == expected[record["id"]]


def test_list_keys_of_tenant_without_keys_is_empty(gateway: Gateway) -> None:
    tenant = gateway.create_tenant()
    response = gateway.admin.get("/admin/keys", params={"tenant_id": tenant["id"]})
    assert response.json() == {"object": "list", "data": []}


def test_revoke_key(gateway: Gateway) -> None:
    tenant = gateway.create_tenant()
    record = create_key(gateway, tenant["id"])
    assert models_status(gateway, record["key"]) == 200
    response = gateway.admin.delete(f"/admin/keys/{record['id']}")
    assert response.status_code == 200
    revoked = response.json()
    assert revoked["id"] == record["id"]
    assert abs(revoked["revoked_at"] - time.time()) < 60
    assert_no_secrets(response.text, revoked, [record["key"]])
    wait_for_status(gateway, record["key"], 401)
    again = gateway.admin.delete(f"/admin/keys/{record['id']}")  # idempotent: first time kept
    assert again.status_code == 200
    assert again.json()["revoked_at"] == revoked["revoked_at"]
    assert gateway.admin.get(f"/admin/keys/{record['id']}").json() == revoked


@pytest.mark.parametrize(
    ("method", "path"),
    [
        pytest.param("GET", "/admin/keys/0123456789abcdef", id="get"),
        pytest.param("DELETE", "/admin/keys/0123456789abcdef", id="revoke"),
    ],
)
def test_unknown_key_is_404(gateway: Gateway, method: str, path: str) -> None:
    response = gateway.admin.request(method, path)
    assert "0123456789abcdef" in assert_error(response, 404, "key_id")


@pytest.mark.parametrize(
    ("tenant_tier", "key_tier", "status"),
    [
        pytest.param("standard", "batch", 201, id="standard-narrowed-to-batch"),
        pytest.param("standard", "standard", 201, id="standard-kept"),
        pytest.param("interactive", "batch", 201, id="interactive-narrowed-to-batch"),
        pytest.param("interactive", "standard", 201, id="interactive-narrowed-to-standard"),
        pytest.param("standard", "interactive", 400, id="standard-raised-to-interactive"),
        pytest.param("batch", "standard", 400, id="batch-raised-to-standard"),
        pytest.param("batch", "interactive", 400, id="batch-raised-to-interactive"),
        pytest.param("standard", "gold", 400, id="unknown-tier"),
    ],
)
def test_key_tier_may_narrow_but_not_raise(
    gateway: Gateway, tenant_tier: str, key_tier: str, status: int
) -> None:
    tenant = gateway.create_tenant(tier=tenant_tier)
    response = gateway.admin.post("/admin/keys", json={"tenant_id": tenant["id"], "tier": key_tier})
    if status == 201:
        assert response.status_code == 201, response.text
        assert response.json()["tier"] == key_tier
        assert models_status(gateway, response.json()["key"]) == 200
    else:
        assert key_tier in assert_error(response, 400, "tier")
        listing = gateway.admin.get("/admin/keys", params={"tenant_id": tenant["id"]}).json()
        assert listing["data"] == []


@pytest.mark.parametrize(
    ("body", "param"),
    [
        pytest.param({}, "tenant_id", id="missing-tenant"),
        pytest.param({"expires_in_s": 0}, "expires_in_s", id="zero-expiry"),
        pytest.param({"expires_in_s": "soon"}, "expires_in_s", id="expiry-not-number"),
        pytest.param({"name": "x" * 201}, "name", id="name-too-long"),
        pytest.param({"key": "sy-choose-my-own"}, "key", id="client-chosen-key"),
    ],
)
def test_create_key_rejects_bad_bodies(
    gateway: Gateway, body: dict[str, Any], param: str
) -> None:
    tenant = gateway.create_tenant()
    full = {"tenant_id": tenant["id"], **body} if param != "tenant_id" else body
    response = gateway.admin.post("/admin/keys", json=full)
    assert f"'{param}'" in assert_error(response, 400, param)

"""Imported API keys end to end: the admin API stores only their digest, they authenticate
through the same checks as generated keys, weak or duplicate keys are refused, and the key
string shows up in no response, no log line and nowhere in Redis."""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import redis

from gateway.cli.localproc import ProcessGroup
from tests.fleet import KEY_SECRET, MODEL, Engine, Gateway
from tests.gateway.test_keys import assert_error, chat, list_models, poll_status, redis_values


def random_key(prefix: str = "sk-live-") -> str:
    return prefix + secrets.token_urlsafe(32)


def import_key(gw: Gateway, tenant_id: str, key: str, **fields: Any) -> httpx.Response:
    return gw.admin.post("/admin/keys/import", json={"tenant_id": tenant_id, "key": key, **fields})


def imported(gw: Gateway, tenant_id: str, key: str, **fields: Any) -> dict[str, Any]:
    response = import_key(gw, tenant_id, key, **fields)
    assert response.status_code == 201, response.text
    assert_not_echoed(response.text, key)
    return dict(response.json())


def needles(key: str) -> set[str]:
    """The key and any 8 characters of its secret (all of it, but for an ``sy-`` key's public
    id): any of them in a response, a log or Redis is a leak."""
    secret = key[-43:] if key.startswith("sy-") else key
    return {key} | {secret[i:i + 8] for i in range(len(secret) - 7)}


def assert_not_echoed(text: str, key: str) -> None:
    leaks = sorted(n for n in needles(key) if n in text)
    assert not leaks, f"key material echoed: {leaks[:3]}"


# -- imported keys authenticate ---------------------------------------------------------------


def test_imported_key_serves_a_chat_completion(gateway: Gateway) -> None:
    tenant = gateway.create_tenant(models=[MODEL])
    key = random_key()
    before = time.time()
    record = imported(gateway, tenant["id"], key, name="from the old gateway")
    assert record["object"] == "api_key"
    assert record["tenant_id"] == tenant["id"]
    assert record["name"] == "from the old gateway"
    assert record["imported"] is True
    assert record["hint"] == f"...{key[-4:]}"
    assert before - 1 <= record["created_at"] <= time.time() + 1
    assert "key" not in record and "digest" not in record
    assert gateway.admin.get(f"/admin/keys/{record['id']}").json() == record

    client = openai.OpenAI(base_url=gateway.url + "/v1", api_key=key, max_retries=0)
    completion = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "a b c"}], max_tokens=3
    )
    assert completion.choices[0].message.content
    assert completion.usage is not None and completion.usage.completion_tokens == 3
    assert [m.id for m in client.models.list()] == [MODEL]


def test_imported_key_in_the_sy_shape_keeps_its_id(gateway: Gateway) -> None:
    tenant = gateway.create_tenant()
    key_id = secrets.token_hex(8)
    key = f"sy-{key_id}-{secrets.token_urlsafe(32)}"
    record = imported(gateway, tenant["id"], key)
    assert record["id"] == key_id
    assert record["hint"] == f"sy-{key_id}-...{key[-4:]}"
    assert chat(gateway, key).status_code == 200


def test_generated_keys_still_work_beside_imported_ones(gateway: Gateway) -> None:
    tenant = gateway.create_tenant()
    imported(gateway, tenant["id"], random_key())
    generated = gateway.create_key(tenant["id"])
    assert chat(gateway, generated).status_code == 200
    assert_error(chat(gateway, random_key()), 401, "invalid_api_key")


def test_imported_key_is_revoked_and_disabled_like_any_key(gateway: Gateway) -> None:
    tenant = gateway.create_tenant()
    key = random_key()
    record = imported(gateway, tenant["id"], key)
    assert chat(gateway, key).status_code == 200  # cached now, under the key's digest
    assert gateway.admin.delete(f"/admin/keys/{record['id']}").status_code == 200
    poll_status(gateway, key, 401, timeout_s=1.0)
    assert_error(chat(gateway, key), 401, "revoked_api_key")

    other = random_key()
    imported(gateway, tenant["id"], other)
    assert chat(gateway, other).status_code == 200
    assert gateway.admin.delete(f"/admin/tenants/{tenant['id']}").status_code == 200
    poll_status(gateway, other, 403, timeout_s=1.0)
    assert_error(chat(gateway, other), 403, "tenant_disabled")


def test_key_tried_before_its_import_works_right_after(gateway: Gateway) -> None:
    """A client that switched over early has a cached "no such key"; the import clears it."""
    tenant = gateway.create_tenant()
    key = random_key()
    error = assert_error(chat(gateway, key), 401, "invalid_api_key")
    assert "no such key" in error["message"]
    imported(gateway, tenant["id"], key)
    poll_status(gateway, key, 200, timeout_s=1.0)  # the cache would hold the miss for 30 s


def test_imported_key_expiry_and_tier(gateway: Gateway) -> None:
    tenant = gateway.create_tenant(tier="standard")
    key = random_key()
    record = imported(gateway, tenant["id"], key, expires_in_s=0.5, tier="batch")
    assert record["tier"] == "batch"
    assert record["expires_at"] <= time.time() + 0.5
    assert chat(gateway, key).status_code == 200
    time.sleep(0.55)
    assert_error(chat(gateway, key), 401, "expired_api_key")

    raised = import_key(gateway, tenant["id"], random_key(), tier="interactive")
    assert raised.status_code == 400 and raised.json()["error"]["param"] == "tier"


# -- refused keys -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "needle"),
    [
        pytest.param("Xq7#pL2v9Kw", "at least 20", id="too-short"),
        pytest.param("x" * 257 + secrets.token_urlsafe(8), "at most 256", id="too-long"),
        pytest.param("z" * 40, "one character repeated", id="one-character"),
        pytest.param("abcdefghijklmnopqrstuvwxyz", "neighbouring characters",
                     id="alphabet"),
        pytest.param("0123456789abcdefghijklmnop", "neighbouring characters",
                     id="digits-then-letters"),
        pytest.param("Pa55w0rd!" * 4, "repeats parts of itself", id="repeated-word"),
        pytest.param("3a9c0f3a9c0f7b2e1d7b2e1d", "repeats parts of itself",
                     id="repeated-halves"),
        pytest.param("c0ffeec0ffee" + "badc0de5", "bits", id="low-entropy"),
        pytest.param(random_key()[:12] + " " + random_key()[:12], "whitespace", id="space"),
        pytest.param(random_key() + "\n", "trailing newline", id="trailing-newline"),
        pytest.param(random_key()[:16] + "\t" + random_key()[:16], "whitespace", id="tab"),
        pytest.param(random_key() + "é", "printable ASCII", id="non-ascii"),
        pytest.param(random_key() + "\x07", "printable ASCII", id="control-character"),
        pytest.param("sy-" + random_key(""), "not a switchyard key", id="sy-prefix-other-shape"),
        pytest.param(f"sy-{'0' * 16}-" + "A" * 43, "one character repeated",
                     id="sy-shape-weak-secret"),
    ],
)
def test_weak_or_malformed_keys_are_refused(gateway: Gateway, key: str, needle: str) -> None:
    tenant = gateway.create_tenant()
    response = import_key(gateway, tenant["id"], key)
    message = assert_error(response, 400, "invalid_request")["message"]
    assert response.json()["error"]["param"] == "key"
    assert needle in message
    assert message.startswith("Invalid 'key': ")
    assert_not_echoed(response.text, key)
    listing = gateway.admin.get("/admin/keys", params={"tenant_id": tenant["id"]}).json()
    assert listing["data"] == []


@pytest.mark.parametrize(
    ("body", "param"),
    [
        pytest.param({}, "key", id="missing-key"),
        pytest.param({"key": 12345678901234567890123}, "key", id="key-not-string"),
        pytest.param({"key": random_key(), "name": "x" * 201}, "name", id="name-too-long"),
        pytest.param({"key": random_key(), "expires_in_s": 0}, "expires_in_s", id="zero-expiry"),
        pytest.param({"key": random_key(), "colour": "blue"}, "colour", id="unknown-field"),
    ],
)
def test_bad_import_bodies_are_refused(gateway: Gateway, body: dict[str, Any], param: str) -> None:
    tenant = gateway.create_tenant()
    response = gateway.admin.post("/admin/keys/import", json={"tenant_id": tenant["id"], **body})
    assert_error(response, 400, "invalid_request")
    assert response.json()["error"]["param"] == param
    if isinstance(body.get("key"), str):
        assert_not_echoed(response.text, body["key"])


def test_import_for_unknown_tenant_is_404(gateway: Gateway) -> None:
    response = import_key(gateway, "t-nope", random_key())
    assert_error(response, 404, "not_found")
    assert response.json()["error"]["param"] == "tenant_id"


def test_duplicate_keys_are_refused(gateway: Gateway) -> None:
    tenant, other = gateway.create_tenant(), gateway.create_tenant()
    key = random_key()
    first = imported(gateway, tenant["id"], key)
    for tenant_id in (tenant["id"], other["id"]):  # a key names one tenant, whichever asks
        again = import_key(gateway, tenant_id, key)
        message = assert_error(again, 409, "conflict")["message"]
        assert first["id"] in message and "already stored" in message
        assert_not_echoed(again.text, key)
    assert gateway.admin.delete(f"/admin/keys/{first['id']}").status_code == 200
    assert import_key(gateway, other["id"], key).status_code == 409  # revoked stays revoked
    assert [k["id"] for k in gateway.admin.get(
        "/admin/keys", params={"tenant_id": other["id"]}).json()["data"]] == []

    generated = gateway.admin.post("/admin/keys", json={"tenant_id": tenant["id"]}).json()
    taken = import_key(gateway, other["id"], generated["key"])
    assert generated["id"] in assert_error(taken, 409, "conflict")["message"]
    assert chat(gateway, generated["key"]).status_code == 200  # still the first tenant's


# -- the key string is kept nowhere -----------------------------------------------------------


def test_redis_holds_only_the_digest_of_imported_keys(gateway: Gateway, redis_url: str) -> None:
    tenant = gateway.create_tenant()
    keys = [random_key() for _ in range(3)] + [secrets.token_hex(20), random_key("")]
    records = [imported(gateway, tenant["id"], key) for key in keys]
    for key in keys:
        assert list_models(gateway, key).status_code == 200

    client = redis.Redis.from_url(redis_url)
    blobs: list[bytes] = []
    for name in client.scan_iter(count=1000):
        blobs.append(name)
        blobs.extend(redis_values(client, name))
    client.close()
    everything = b"\n".join(blobs)

    leaks = sorted(n for key in keys for n in needles(key) if n.encode() in everything)
    assert not leaks, f"key material found in Redis: {leaks[:3]}"
    for record, key in zip(records, keys, strict=True):
        digest = hmac.new(KEY_SECRET.encode(), key.encode(), hashlib.sha256).hexdigest()
        assert record["id"].encode() in everything
        assert digest.encode() in everything  # the scan did see the records
        assert hashlib.sha256(key.encode()).hexdigest().encode() not in everything


@pytest.fixture(scope="module")
def logged_gateway(
    workdir: Path, redis_url: str, engines: list[Engine]
) -> Iterator[tuple[Gateway, Path]]:
    """A gateway logging at debug level into a file of its own."""
    log_dir = workdir / f"logs-{secrets.token_hex(4)}"
    log_dir.mkdir()
    with ProcessGroup(log_dir=log_dir) as group:
        gw = Gateway(group, workdir, redis_url, [e.backend_config() for e in engines],
                     log_level="debug")
        yield gw, log_dir / f"gateway-{gw.port}.log"


def test_key_string_never_reaches_the_gateway_log(logged_gateway: tuple[Gateway, Path]) -> None:
    gw, log_path = logged_gateway
    tenant = gw.create_tenant()
    good, weak, spaced = random_key(), "short-key", random_key()[:20] + " x"
    imported(gw, tenant["id"], good)
    assert import_key(gw, tenant["id"], good).status_code == 409
    assert import_key(gw, tenant["id"], weak).status_code == 400
    assert import_key(gw, tenant["id"], spaced).status_code == 400
    assert chat(gw, good).status_code == 200
    stranger = random_key()
    assert chat(gw, stranger).status_code == 401
    gw.terminate()
    gw.process.wait(timeout=15)

    log = log_path.read_text(errors="replace")
    assert "gateway stopped" in log  # the file does hold the gateway's log
    for key in (good, spaced, stranger):
        assert_not_echoed(log, key)
    assert weak not in log

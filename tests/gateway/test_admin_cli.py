"""The `switchyard tenants|keys` CLI end to end, against a real gateway."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.fleet import ADMIN_TOKEN, MODEL, Gateway

SWITCHYARD = str(Path(sys.executable).parent / "switchyard")


# -- the CLI ----------------------------------------------------------------------------------


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SWITCHYARD_")}
    return subprocess.run(
        [SWITCHYARD, *args], capture_output=True, text=True, env={**clean, **(env or {})},
        timeout=30, check=False,
    )


def cli_json(*args: str, env: dict[str, str] | None = None) -> Any:
    result = cli(*args, env=env)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_cli_end_to_end(gateway: Gateway) -> None:
    flags = ("--url", gateway.url, "--admin-token", ADMIN_TOKEN)
    env = {"SWITCHYARD_URL": gateway.url, "SWITCHYARD_ADMIN_TOKEN": ADMIN_TOKEN}
    tenant_id = f"cli-{uuid.uuid4().hex[:8]}"

    tenant = cli_json("tenants", "create", "--name", "CLI tenant", "--id", tenant_id,
                      "--models", f"{MODEL}, model-a", "--tier", "batch", "--rpm", "100", *flags)
    assert tenant["id"] == tenant_id
    assert tenant["models"] == [MODEL, "model-a"]
    assert tenant["tier"] == "batch"
    assert tenant["limits"]["requests_per_minute"] == 100
    assert cli_json("tenants", "get", tenant_id, env=env) == tenant
    assert tenant_id in {t["id"] for t in cli_json("tenants", "list", env=env)["data"]}

    created = cli("keys", "create", "--tenant", tenant_id, "--name", "laptop", env=env)
    assert created.returncode == 0, created.stderr
    record = json.loads(created.stdout)
    assert "not shown again" in created.stderr
    key = record["key"]

    client = openai.OpenAI(base_url=gateway.url + "/v1", api_key=key, max_retries=0)
    assert sorted(m.id for m in client.models.list()) == ["model-a", MODEL]
    completion = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "a b c"}], max_tokens=3
    )
    assert completion.usage is not None
    assert completion.usage.completion_tokens == 3

    listed = cli("keys", "list", "--tenant", tenant_id, env=env)
    assert listed.returncode == 0
    assert key not in listed.stdout
    assert [k["id"] for k in json.loads(listed.stdout)["data"]] == [record["id"]]

    revoked = cli_json("keys", "revoke", record["id"], *flags)
    assert revoked["revoked_at"] is not None
    deadline = time.monotonic() + 1.0
    while True:
        try:
            client.models.list()
        except openai.AuthenticationError as exc:
            assert exc.code == "revoked_api_key"
            break
        assert time.monotonic() < deadline, "revoked key still accepted after 1 s"
        time.sleep(0.01)
    with pytest.raises(openai.AuthenticationError):
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}])

    disabled = cli_json("tenants", "disable", tenant_id, env=env)
    assert disabled["enabled"] is False
    enabled = cli_json("tenants", "update", tenant_id, "--enable", "--models", "model-b", env=env)
    assert enabled["enabled"] is True
    assert enabled["models"] == ["model-b"]


@pytest.mark.parametrize(
    ("args", "env", "code", "needle"),
    [
        pytest.param(("tenants", "list"), {}, 2, "--admin-token", id="no-admin-token"),
        pytest.param(("tenants", "list", "--admin-token", "wrong"), None, 1, "error (401)",
                     id="wrong-admin-token"),
        pytest.param(("tenants", "get", "t-nope"), None, 1, "error (404)", id="unknown-tenant"),
        pytest.param(("tenants", "create", "--name", "x", "--tier", "gold"), None, 1,
                     "Unknown tier", id="unknown-tier"),
        pytest.param(("keys", "create", "--tenant", "t-nope"), None, 1, "error (404)",
                     id="key-for-unknown-tenant"),
        pytest.param(("keys", "revoke", "0123456789abcdef"), None, 1, "error (404)",
                     id="revoke-unknown-key"),
        pytest.param(("keys", "list", "--url", "http://127.0.0.1:9"), None, 1, "cannot reach",
                     id="gateway-unreachable"),
    ],
)
def test_cli_errors(
    gateway: Gateway, args: tuple[str, ...], env: dict[str, str] | None, code: int, needle: str
) -> None:
    full_env = {"SWITCHYARD_URL": gateway.url, "SWITCHYARD_ADMIN_TOKEN": ADMIN_TOKEN}
    if env is not None:
        full_env = {"SWITCHYARD_URL": gateway.url, **env}
    result = cli(*args, env=full_env)
    assert result.returncode == code, (result.stdout, result.stderr)
    assert needle in result.stderr
    assert result.stdout == ""


def test_cli_zero_expiry_is_an_error_not_a_key_that_never_expires(gateway: Gateway) -> None:
    tenant = gateway.create_tenant()
    env = {"SWITCHYARD_URL": gateway.url, "SWITCHYARD_ADMIN_TOKEN": ADMIN_TOKEN}
    result = cli("keys", "create", "--tenant", tenant["id"], "--expires-in-s", "0", env=env)
    assert result.returncode == 1
    assert "expires_in_s" in result.stderr
    listing = gateway.admin.get("/admin/keys", params={"tenant_id": tenant["id"]}).json()
    assert listing["data"] == []

"""The `switchyard tenants|keys` CLI end to end, against a real gateway."""

from __future__ import annotations

import json
import os
import secrets
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


def cli(*args: str, env: dict[str, str] | None = None,
        stdin: str = "") -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SWITCHYARD_")}
    return subprocess.run(
        [SWITCHYARD, *args], capture_output=True, text=True, env={**clean, **(env or {})},
        timeout=30, check=False, input=stdin,
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


# -- tenant weights ---------------------------------------------------------------------------


def admin_env(gateway: Gateway) -> dict[str, str]:
    return {"SWITCHYARD_URL": gateway.url, "SWITCHYARD_ADMIN_TOKEN": ADMIN_TOKEN}


def test_cli_sets_and_changes_a_tenants_weight(gateway: Gateway) -> None:
    env = admin_env(gateway)
    tenant = cli_json("tenants", "create", "--name", "weighted", "--weight", "2", env=env)
    assert tenant["weight"] == 2.0
    assert cli_json("tenants", "get", tenant["id"], env=env)["weight"] == 2.0
    updated = cli_json("tenants", "update", tenant["id"], "--weight", "0.5", env=env)
    assert updated["weight"] == 0.5
    assert cli_json("tenants", "create", "--name", "plain", env=env)["weight"] == 1.0
    renamed = cli_json("tenants", "update", tenant["id"], "--name", "renamed", env=env)
    assert renamed["weight"] == 0.5  # an update without --weight keeps it


@pytest.mark.parametrize(
    ("weight", "code", "needle"),
    [
        pytest.param("0", 1, "0.001 to 1000", id="zero"),
        pytest.param("-3", 1, "0.001 to 1000", id="negative"),
        pytest.param("5000", 1, "0.001 to 1000", id="huge"),
        pytest.param("nan", 2, "not a finite number", id="nan"),
        pytest.param("inf", 2, "not a finite number", id="infinite"),
        pytest.param("heavy", 2, "not a number", id="not-a-number"),
    ],
)
def test_cli_bad_weight_is_an_error(gateway: Gateway, weight: str, code: int, needle: str) -> None:
    tenant = gateway.create_tenant()
    env = admin_env(gateway)
    for args in (("tenants", "create", "--name", "x"), ("tenants", "update", tenant["id"])):
        result = cli(*args, "--weight", weight, env=env)
        assert result.returncode == code, (result.stdout, result.stderr)
        assert needle in result.stderr
        assert result.stdout == ""
    assert gateway.admin.get(f"/admin/tenants/{tenant['id']}").json() == tenant


# -- keys import ------------------------------------------------------------------------------


def test_cli_imports_a_key_from_stdin_and_it_serves_requests(gateway: Gateway) -> None:
    tenant = gateway.create_tenant()
    key = "sk-old-" + secrets.token_urlsafe(32)
    result = cli("keys", "import", "--tenant", tenant["id"], "--name", "moved",
                 env=admin_env(gateway), stdin=key + "\n")
    assert result.returncode == 0, result.stderr
    assert key not in result.stdout + result.stderr
    assert key[-20:] not in result.stdout + result.stderr
    record = json.loads(result.stdout)
    assert record["imported"] is True
    assert record["tenant_id"] == tenant["id"]
    assert record["name"] == "moved"
    assert "key" not in record

    client = openai.OpenAI(base_url=gateway.url + "/v1", api_key=key, max_retries=0)
    completion = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "a b"}], max_tokens=2
    )
    assert completion.usage is not None and completion.usage.completion_tokens == 2

    again = cli("keys", "import", "--tenant", tenant["id"], env=admin_env(gateway), stdin=key)
    assert again.returncode == 1
    assert "error (409)" in again.stderr and record["id"] in again.stderr
    assert key not in again.stdout + again.stderr


def test_cli_imports_a_key_from_a_file(gateway: Gateway, tmp_path: Path) -> None:
    tenant = gateway.create_tenant()
    key = secrets.token_hex(24)
    key_file = tmp_path / "key.txt"
    key_file.write_text(key + "\n")
    record = cli_json("keys", "import", "--tenant", tenant["id"], "--key-file", str(key_file),
                      "--tier", "batch", env=admin_env(gateway))
    assert record["tier"] == "batch"
    listed = cli("keys", "list", "--tenant", tenant["id"], env=admin_env(gateway))
    assert [k["id"] for k in json.loads(listed.stdout)["data"]] == [record["id"]]
    assert key not in listed.stdout
    client = openai.OpenAI(base_url=gateway.url + "/v1", api_key=key, max_retries=0)
    assert [m.id for m in client.models.list()]


@pytest.mark.parametrize(
    ("args", "stdin", "code", "needle"),
    [
        pytest.param((), "", 2, "no key given", id="empty-stdin"),
        pytest.param((), "  \n", 2, "no key given", id="blank-stdin"),
        pytest.param(("--key-file", "/nonexistent/key"), "", 2, "cannot read the key",
                     id="missing-file"),
        pytest.param((), "short-key-1", 1, "at least 20", id="too-short"),
        pytest.param((), "two keys\nper line", 1, "whitespace", id="whitespace"),
        pytest.param((), "q" * 32, 1, "one character repeated", id="repeated"),
        pytest.param(("--key", "sk-" + secrets.token_urlsafe(32)), "", 2,
                     "never taken from the command line", id="no-key-in-argv"),
        pytest.param(("--key-file", "sk-" + secrets.token_urlsafe(32)), "", 2,
                     "No such file", id="key-given-as-file-name"),
    ],
)
def test_cli_import_errors(
    gateway: Gateway, args: tuple[str, ...], stdin: str, code: int, needle: str
) -> None:
    tenant = gateway.create_tenant()
    result = cli("keys", "import", "--tenant", tenant["id"], *args, env=admin_env(gateway),
                 stdin=stdin)
    assert result.returncode == code, (result.stdout, result.stderr)
    assert needle in result.stderr
    assert result.stdout == ""
    for secret in (stdin.strip(), *args[1:]):
        if secret and not secret.startswith("/"):
            assert secret not in result.stderr
    listing = gateway.admin.get("/admin/keys", params={"tenant_id": tenant["id"]}).json()
    assert listing["data"] == []

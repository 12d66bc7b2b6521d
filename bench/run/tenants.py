"""API keys for the run's tenants: made through the gateway's admin API, or read from a file.

The keys file is JSON, a list of ``{"tenant": ..., "tier": ..., "key": ...}``; a run that makes
keys writes one (mode 0600) beside its results, so a later run can reuse them. Example::

    tenants = provision(parse_tenants("standard:2"), "http://127.0.0.1:8080", admin_token)
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from urllib.parse import urlsplit

import httpx

from bench.run.options import OptionError
from bench.run.spec import TenantSpec


def origin_of(url: str) -> str:
    """``http://127.0.0.1:8080/v1`` -> ``http://127.0.0.1:8080``."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


def provision(tenants: Sequence[TenantSpec], origin: str, admin_token: str) -> list[TenantSpec]:
    """Create each tenant (or reuse it if it exists) and a fresh key for it."""
    headers = {"Authorization": f"Bearer {admin_token}"}
    made: list[TenantSpec] = []
    with httpx.Client(base_url=origin, headers=headers, timeout=10) as admin:
        for tenant in tenants:
            created = admin.post("/admin/tenants", json={
                "id": tenant.name, "name": tenant.name, "tier": tenant.tier, "models": ["*"],
            })
            if created.status_code not in (201, 409):
                raise OptionError(f"cannot create tenant {tenant.name!r} through {origin}/admin: "
                                  f"HTTP {created.status_code} {created.text[:300]}")
            key = admin.post("/admin/keys", json={"tenant_id": tenant.name, "name": "bench"})
            if key.status_code != 201:
                raise OptionError(f"cannot create a key for {tenant.name!r}: "
                                  f"HTTP {key.status_code} {key.text[:300]}")
            made.append(replace(tenant, key=str(key.json()["key"])))
    return made


def read_keys(path: Path) -> list[TenantSpec]:
    """Tenants with their keys from a keys file."""
    try:
        entries = json.loads(path.read_text())
        return [TenantSpec(str(e["tenant"]), str(e["tier"]), str(e["key"])) for e in entries]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise OptionError(f"{path}: expected a JSON list of {{tenant, tier, key}} ({exc})")\
            from None


def write_keys(tenants: Sequence[TenantSpec], path: Path) -> None:
    """Save the tenants' keys (mode 0600) for a later ``--keys-file``."""
    entries = [{"tenant": t.name, "tier": t.tier, "key": t.key} for t in tenants]
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as file:
        json.dump(entries, file, indent=1)

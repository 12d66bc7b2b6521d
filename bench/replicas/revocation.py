"""Revocation latency across the replicas.

Each trial makes a fresh key, has every replica accept it once (``GET /v1/models``, so each
holds it in its key cache), then revokes it through one replica's admin API (a different one
each trial) while polling every replica directly, every ``poll_s``, with the key. A replica's
latency is the time from sending the revoke to its first 401; a replica still answering 200
after ``bound_s`` counts as never. Example::

    trials = measure_revocation(fleet, num_trials=5)
    revocation_figures(trials)["max_s"]
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

import aiohttp
import uvloop

from bench.replicas.fleet import ReplicaFleet
from gateway.cli.localfleet import create_tenant

MODELS_PATH = "/v1/models"


async def _status(session: aiohttp.ClientSession, url: str, key: str) -> int:
    async with session.get(url + MODELS_PATH, headers={"Authorization": f"Bearer {key}"}) as r:
        await r.read()
        return r.status


async def _first_refusal(session: aiohttp.ClientSession, url: str, key: str, started: float,
                         bound_s: float, poll_s: float) -> float | None:
    while (elapsed_s := time.perf_counter() - started) < bound_s:
        if await _status(session, url, key) == 401:
            return time.perf_counter() - started
        await asyncio.sleep(max(0.0, poll_s - (time.perf_counter() - started - elapsed_s)))
    return None


async def _trial(urls: Sequence[str], revoke_via: str, admin_token: str, key_id: str, key: str,
                 bound_s: float, poll_s: float) -> dict[str, float | None]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
        for url in urls:  # every replica has the key in its cache
            status = await _status(session, url, key)
            if status != 200:
                raise RuntimeError(f"{url} refused a fresh key: HTTP {status}")
        started = time.perf_counter()
        revoke = session.delete(f"{revoke_via}/admin/keys/{key_id}",
                                headers={"Authorization": f"Bearer {admin_token}"})
        polls = [asyncio.create_task(_first_refusal(session, url, key, started, bound_s,
                                                    poll_s)) for url in urls]
        async with revoke as response:
            if response.status != 200:
                raise RuntimeError(f"revoke failed: HTTP {response.status} "
                                   f"{(await response.text())[:200]}")
        latencies = await asyncio.gather(*polls)
    return dict(zip(urls, latencies, strict=True))


def measure_revocation(fleet: ReplicaFleet, *, num_trials: int = 5, bound_s: float = 5.0,
                       poll_s: float = 0.01) -> list[dict[str, float | None]]:
    """``num_trials`` trials; each, replica URL -> seconds to its first refusal (or None)."""
    urls = [r.url for r in fleet.replicas]
    tenant_id = f"revocation-{time.strftime('%H%M%S')}"
    trials = []
    with fleet.local_admin() as admin:
        create_tenant(admin, {"id": tenant_id, "name": tenant_id, "models": ["*"]})
        for index in range(num_trials):
            made = admin.post("/admin/keys", json={"tenant_id": tenant_id,
                                                   "name": f"trial-{index}"})
            made.raise_for_status()
            key_id, key = str(made.json()["id"]), str(made.json()["key"])
            trials.append(uvloop.run(_trial(urls, urls[index % len(urls)], fleet.admin_token,
                                            key_id, key, bound_s, poll_s)))
    return trials

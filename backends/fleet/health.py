"""Active health checks: probe each backend's health path on an interval.

A backend that fails a request is taken out at once (passively, by the proxy); only a
successful probe brings it back.
"""

from __future__ import annotations

import asyncio
import logging

import aiohttp

from backends.fleet.registry import Backend, BackendRegistry

log = logging.getLogger(__name__)


class HealthChecker:
    def __init__(
        self,
        registry: BackendRegistry,
        session: aiohttp.ClientSession,
        *,
        interval_s: float,
        timeout_s: float,
    ) -> None:
        self._registry = registry
        self._session = session
        self._interval_s = interval_s
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)

    async def probe(self, backend: Backend) -> bool:
        headers = {"Authorization": f"Bearer {backend.api_key}"} if backend.api_key else None
        try:
            async with self._session.get(
                backend.url + backend.health_path, timeout=self._timeout, headers=headers
            ) as resp:
                await resp.read()
                ok = resp.status == 200
                reason = f"health probe returned HTTP {resp.status}"
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            ok, reason = False, f"health probe failed: {exc.__class__.__name__}"
        if ok:
            if not backend.is_healthy:
                log.info("backend %s is healthy again", backend.name)
            backend.mark_success()
        else:
            if backend.is_healthy:
                log.warning("backend %s is unhealthy: %s", backend.name, reason)
            backend.mark_failure(reason)
        return ok

    async def probe_all(self) -> None:
        # Every backend, heartbeat workers too: one whose heartbeat goes on while its HTTP
        # server does not answer is down for requests. Not shared among replicas (as scrapes
        # are, backends.fleet.scrape_share): whether this replica reaches it is its own.
        await asyncio.gather(
            *(self.probe(b) for b in self._registry.backends))

    async def run(self) -> None:
        """Probe every backend each interval until cancelled."""
        while True:
            await self.probe_all()
            await asyncio.sleep(self._interval_s)

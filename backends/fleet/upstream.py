"""The upstream client: a lean HTTP/1.1 pool per backend for completions, and one shared aiohttp
session for everything off the hot path (health checks, fleet polls, metric scrapes).

Timeouts, each separate:

- ``connect_timeout_s``: TCP connect to the engine;
- ``first_byte_timeout_s``: request sent until the first body bytes of a stream (for a
  non-streaming request the whole body *is* the first byte, so ``request_timeout_s`` applies);
- ``idle_timeout_s``: the longest gap between two chunks of a stream;
- ``request_timeout_s``: the whole exchange.

Example::

    client = UpstreamClient(settings.upstream)
    await client.start()
    opened = await client.open(backend, "/v1/chat/completions", raw, headers, is_stream=True)
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import aiohttp

from backends.fleet.deadlines import Deadlines
from backends.fleet.http1 import Pool, Response, UpstreamBroken
from backends.fleet.registry import Backend, BackendDown

RETRYABLE_STATUSES = frozenset({500, 502, 503, 504})  # tried on another backend, once


class UpstreamSettings(Protocol):
    """The timeouts and pool size (``gateway.settings.UpstreamSettings`` satisfies it)."""

    @property
    def connect_timeout_s(self) -> float: ...
    @property
    def first_byte_timeout_s(self) -> float: ...
    @property
    def request_timeout_s(self) -> float: ...
    @property
    def idle_timeout_s(self) -> float: ...
    @property
    def max_connections_per_backend(self) -> int: ...


class UpstreamFailure(Exception):
    """The attempt failed before any byte reached the client."""

    def __init__(self, backend: Backend, reason: str, message: str, *, is_timeout: bool = False):
        super().__init__(message)
        self.backend = backend
        self.reason = reason
        self.is_timeout = is_timeout


@dataclass(slots=True, init=False)
class Opened:
    """A response whose status and headers have arrived, with its first body bytes: the first
    chunk of a stream, or the whole body otherwise."""

    backend: Backend
    response: Response
    first_chunk: bytes

    def __init__(self, backend: Backend, response: Response, first_chunk: bytes) -> None:
        self.backend = backend
        self.response = response
        self.first_chunk = first_chunk


# Called with ("upstream_connect", started_s) once a connection is ready (``RequestTrace.waited``).
ConnectTimer = Callable[[str, float], object]


class UpstreamClient:
    def __init__(self, settings: UpstreamSettings) -> None:
        self.settings = settings
        self._session: aiohttp.ClientSession | None = None
        self._pools: dict[str, Pool] = {}
        self._deadlines = Deadlines()
        self._timeout = aiohttp.ClientTimeout(
            total=None,
            connect=settings.connect_timeout_s,
            sock_connect=settings.connect_timeout_s,
        )

    @property
    def session(self) -> aiohttp.ClientSession:
        """The aiohttp session for health checks and polls (not for completions)."""
        if self._session is None:
            raise RuntimeError("UpstreamClient.start() was not called")
        return self._session

    async def start(self) -> None:
        connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=60, keepalive_timeout=30)
        self._session = aiohttp.ClientSession(
            connector=connector,
            timeout=self._timeout,
            auto_decompress=False,
            skip_auto_headers=("User-Agent",),
        )

    async def close(self) -> None:
        pools, self._pools = self._pools, {}
        for pool in pools.values():
            pool.close()
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _pool(self, backend: Backend) -> Pool:
        pool = self._pools.get(backend.url)
        if pool is None:
            settings = self.settings
            pool = self._pools[backend.url] = Pool(
                backend.url, settings.max_connections_per_backend, settings.connect_timeout_s)
        return pool

    async def open(
        self,
        backend: Backend,
        path: str,
        body: bytes,
        headers: dict[str, str],
        *,
        is_stream: bool,
        timer: ConnectTimer | None = None,
    ) -> Opened:
        """Send the request; return once headers (and a stream's first chunk) have arrived."""
        if backend.api_key:
            headers = {**headers, "Authorization": f"Bearer {backend.api_key}"}
        settings = self.settings
        wait_s = settings.first_byte_timeout_s if is_stream else settings.request_timeout_s
        pool = self._pool(backend)
        head = pool.head(path, len(body), headers)
        response: Response | None = None
        # The response while it waits for its head, for the finally below: compiled (mypyc),
        # a finally block takes ``response`` for the Response it was narrowed to in the try,
        # even when the send failed and it is None.
        awaiting: list[Response] = []
        connecting = True
        pool_was_full = pool.is_full
        started_s = time.perf_counter()
        try:
            with self._deadlines.limit(wait_s):  # one timer for all waits, not one each
                try:
                    response = await pool.send(head, body)
                finally:  # the wait counts on the trace even when it failed
                    if timer is not None:
                        timer("upstream_connect", started_s)
                connecting = False
                backend.awaiting_head.add(response)
                awaiting.append(response)
                await response.wait_head()
                if is_stream and response.status == 200:
                    first = await response.readany()
                    if not first:
                        raise UpstreamBroken("stream ended before its first chunk")
                else:
                    first = await response.read()  # the whole body, within the same timeout
        except TimeoutError:
            if response is not None:
                response.close()
            if connecting and pool_was_full:  # busy, not broken: the backend is not marked
                raise UpstreamFailure(
                    backend, "pool_timeout",
                    f"all {settings.max_connections_per_backend} connections to backend "
                    f"{backend.name!r} stayed busy for {wait_s:g} s", is_timeout=True,
                ) from None
            if connecting:
                raise UpstreamFailure(
                    backend, "connect",
                    f"cannot connect to backend {backend.name!r} within "
                    f"{min(wait_s, settings.connect_timeout_s):g} s", is_timeout=True,
                ) from None
            raise UpstreamFailure(
                backend, "timeout",
                f"backend {backend.name!r} sent nothing within {wait_s:g} s",
                is_timeout=True,
            ) from None
        except BackendDown as down:
            assert response is not None
            response.close()
            raise UpstreamFailure(backend, "backend_down", f"{down}; nothing was sent back "
                                  "before that") from None
        except (UpstreamBroken, OSError) as exc:
            if response is not None:
                response.close()
            if connecting:
                reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
                raise UpstreamFailure(
                    backend, "connect", f"cannot connect to backend {backend.name!r}: {reason}"
                ) from None
            raise UpstreamFailure(
                backend, "protocol",
                f"backend {backend.name!r} failed before responding: {exc}",
            ) from None
        except BaseException:
            if response is not None:
                response.close()
            raise
        finally:
            for waited in awaiting:
                backend.awaiting_head.discard(waited)
        return Opened(backend=backend, response=response, first_chunk=first)

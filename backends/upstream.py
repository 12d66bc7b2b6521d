"""The upstream client: one shared aiohttp session, a bounded pool per backend, and timeouts.

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

import asyncio
from dataclasses import dataclass
from typing import Protocol

import aiohttp

from backends.registry import Backend

RETRYABLE_STATUSES = frozenset({502, 503, 504})


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


@dataclass(slots=True)
class Opened:
    """A response whose status and headers have arrived, with its first body bytes: the first
    chunk of a stream, or the whole body otherwise."""

    backend: Backend
    response: aiohttp.ClientResponse
    first_chunk: bytes


class UpstreamClient:
    def __init__(self, settings: UpstreamSettings) -> None:
        self.settings = settings
        self._session: aiohttp.ClientSession | None = None
        self._timeout = aiohttp.ClientTimeout(
            total=None,
            connect=settings.connect_timeout_s,
            sock_connect=settings.connect_timeout_s,
        )

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise RuntimeError("UpstreamClient.start() was not called")
        return self._session

    async def start(self) -> None:
        connector = aiohttp.TCPConnector(
            limit=0,
            limit_per_host=self.settings.max_connections_per_backend,
            ttl_dns_cache=60,
            keepalive_timeout=30,
        )
        self._session = aiohttp.ClientSession(
            connector=connector,
            timeout=self._timeout,
            auto_decompress=False,
            skip_auto_headers=("User-Agent",),
        )

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def open(
        self,
        backend: Backend,
        path: str,
        body: bytes,
        headers: dict[str, str],
        *,
        is_stream: bool,
    ) -> Opened:
        """Send the request; return once headers (and a stream's first chunk) have arrived."""
        if backend.api_key:
            headers = {**headers, "Authorization": f"Bearer {backend.api_key}"}
        settings = self.settings
        wait_s = settings.first_byte_timeout_s if is_stream else settings.request_timeout_s
        response: aiohttp.ClientResponse | None = None
        try:
            async with asyncio.timeout(wait_s):
                response = await self.session.post(backend.url + path, data=body, headers=headers)
                if is_stream and response.status == 200:
                    first = await response.content.readany()
                    if not first and not response.content.is_eof():
                        raise aiohttp.ClientPayloadError("stream ended before its first chunk")
                else:
                    first = await response.read()  # the whole body, within the same timeout
        except TimeoutError:
            if response is not None:
                response.close()
            raise UpstreamFailure(
                backend, "timeout",
                f"backend {backend.name!r} sent nothing within {wait_s:g} s",
                is_timeout=True,
            ) from None
        except aiohttp.ClientConnectorError as exc:
            raise UpstreamFailure(
                backend, "connect", f"cannot connect to backend {backend.name!r}: {exc.strerror}"
            ) from None
        except (aiohttp.ClientError, OSError) as exc:
            if response is not None:
                response.close()
            raise UpstreamFailure(
                backend, "protocol",
                f"backend {backend.name!r} failed before responding: {exc.__class__.__name__}",
            ) from None
        except BaseException:
            if response is not None:
                response.close()
            raise
        return Opened(backend=backend, response=response, first_chunk=first)


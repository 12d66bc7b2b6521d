"""Serving the mock engine: `start` it inside a running loop, or `run` it as a process."""

from __future__ import annotations

import asyncio
import signal
from types import TracebackType

import uvloop
from aiohttp import web

from backends.mock.config import MockEngineConfig
from backends.mock.server import STATS_KEY, create_app
from backends.mock.stats import MockStats

# In-flight handlers get this long to finish on shutdown before they are cancelled.
SHUTDOWN_TIMEOUT_S = 5.0


class MockEngine:
    """A mock engine listening on loopback (or ``config.host``); close it when done.

    Example::

        async with await start(MockEngineConfig()) as engine:
            ...  # point an OpenAI client at f"{engine.url}/v1"
    """

    def __init__(self, runner: web.AppRunner, host: str, port: int) -> None:
        self._runner = runner
        self.host = host
        self.port = port

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def stats(self) -> MockStats:
        return self._runner.app[STATS_KEY]

    async def close(self) -> None:
        await self._runner.cleanup()

    async def __aenter__(self) -> MockEngine:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.close()


async def start(config: MockEngineConfig) -> MockEngine:
    """Start serving ``config`` on the running loop; returns once it is listening."""
    runner = web.AppRunner(
        create_app(config),
        handler_cancellation=True,  # a client that goes away cancels its handler
        access_log=None,
        shutdown_timeout=SHUTDOWN_TIMEOUT_S,
    )
    await runner.setup()
    try:
        site = web.TCPSite(runner, config.host, config.port, reuse_address=True)
        await site.start()
    except BaseException:
        await runner.cleanup()
        raise
    port: int = runner.addresses[0][1]
    return MockEngine(runner, config.host, port)


def run(config: MockEngineConfig) -> None:
    """Serve ``config`` on uvloop until SIGTERM or SIGINT; prints one line once listening."""
    uvloop.run(_serve_until_signalled(config))


async def _serve_until_signalled(config: MockEngineConfig) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    async with await start(config) as engine:
        print(f"mock engine listening on {engine.url}", flush=True)
        await stop.wait()

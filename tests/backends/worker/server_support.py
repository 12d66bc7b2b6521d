"""The worker's HTTP server on the tiny random model, served for real on loopback in a thread
with its own event loop (shared by the server's tests)."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from typing import Any

import httpx
import redis.asyncio as aioredis
from aiohttp import web

from backends.publisher import KvPublisher, WorkerIdentity
from backends.worker.async_engine import AsyncEngine
from backends.worker.engine import LLMEngine
from backends.worker.host import resource_profile
from backends.worker.server import create_app, start_server
from gateway.cli.localproc import free_port
from tests.backends.worker.checkpoints import TINY_CONFIG, tiny_model
from tests.backends.worker.engine_support import make_engine

MODEL = "tiny"
MAX_CONTEXT = 4096
BLOCK_SIZE = 4


def tiny_engine(**config: Any) -> LLMEngine:
    """The tiny random model with room for long outputs (its vocab is printable ASCII)."""
    model = tiny_model(dataclasses.replace(TINY_CONFIG, max_position_embeddings=MAX_CONTEXT))
    settings = {"num_kv_blocks": MAX_CONTEXT // BLOCK_SIZE + 8, "block_size": BLOCK_SIZE,
                "max_batch": 2, "max_num_batched_tokens": 64, **config}
    return make_engine(model, **settings)


class ServerThread:
    """`create_app` + `start_server` on a free loopback port, in a thread with its own loop."""

    def __init__(self, engine: LLMEngine, *, redis_url: str | None = None,
                 worker_id: str = "tiny-worker") -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.worker_id = worker_id
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self.engine: AsyncEngine
        self._runner: web.AppRunner = self._call(self._start(engine, redis_url))

    def _call(self, coroutine: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(timeout=30)

    async def _start(self, engine: LLMEngine, redis_url: str | None) -> web.AppRunner:
        profile = resource_profile(engine, prefill_tokens_per_s=None)
        redis = aioredis.Redis.from_url(redis_url) if redis_url else None
        publisher = None
        if redis is not None:
            publisher = KvPublisher(redis, WorkerIdentity(
                self.worker_id, self.url, (MODEL,), profile), heartbeat_interval_s=0.2)
        self.engine = AsyncEngine(engine, worker_id=self.worker_id, publisher=publisher)
        app = create_app(self.engine, model_name=MODEL, profile=profile)
        if redis is not None:
            app.on_cleanup.append(lambda _: redis.aclose())
        return await start_server(app, "127.0.0.1", self.port, shutdown_timeout_s=2)

    def stop(self) -> None:
        self._call(self._runner.cleanup())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)

    def metrics(self) -> dict[str, float]:
        values = {}
        for line in httpx.get(self.url + "/metrics").text.splitlines():
            if line and not line.startswith("#") and "_bucket" not in line:
                name, _, value = line.rpartition(" ")
                values[name.split("{")[0]] = float(value)
        return values

"""The mock engine: a CPU-cheap, deterministic OpenAI-compatible placeholder worker.

Used by ``switchyard up`` as the local worker, by tests as a real backend on
loopback, and by the gateway overhead benchmark. Per-request test controls ride
in the request's ``"mock"`` object (delays, injected status, hangs, dropped
connections); ``GET /mock/stats`` reports what it saw.

Example::

    async with await start(MockEngineConfig(token_delay_ms=5)) as engine:
        client = openai.AsyncOpenAI(base_url=f"{engine.url}/v1", api_key="unused")
"""

from __future__ import annotations

from backends.mock.config import MockEngineConfig
from backends.mock.runner import MockEngine, run, start
from backends.mock.server import create_app

__all__ = ["MockEngine", "MockEngineConfig", "create_app", "run", "start"]

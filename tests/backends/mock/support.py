"""Constants and helpers shared by the mock engine's tests (fixtures: conftest.py)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp

from backends.mock import MockEngine, MockEngineConfig
from backends.mock.stats import MockStats

REPO_ROOT = Path(__file__).resolve().parents[3]
MODEL = "switchyard-mock"
OTHER_MODEL = "other-model"
CONFIG = MockEngineConfig(models=(MODEL, OTHER_MODEL), default_max_tokens=4)
CHAT = "/v1/chat/completions"
TEXT = "/v1/completions"


def chat_body(content: str = "hello there world", **extra: Any) -> dict[str, Any]:
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": content}]
    return {"model": MODEL, "messages": messages, **extra}


async def post_json(
    session: aiohttp.ClientSession, engine: MockEngine, path: str, body: Any
) -> tuple[int, Any]:
    async with session.post(engine.url + path, json=body) as resp:
        return resp.status, await resp.json()


async def post_stream(
    session: aiohttp.ClientSession, engine: MockEngine, path: str, body: dict[str, Any]
) -> list[bytes]:
    """The payloads of the ``data:`` events of a streamed response, ``[DONE]`` included."""
    async with session.post(engine.url + path, json=body) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"] == "text/event-stream"
        return [line[6:].rstrip(b"\n") async for line in resp.content if line.startswith(b"data: ")]


async def wait_until(predicate: Callable[[MockStats], bool], stats: MockStats) -> None:
    deadline_s = time.monotonic() + 2.0
    while not predicate(stats):
        assert time.monotonic() < deadline_s, f"stats never matched: {stats.snapshot()}"
        await asyncio.sleep(0.01)



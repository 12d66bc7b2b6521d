"""Fixtures of the fleet tests: a client of a private Redis with the shared stream emptied."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis

from backends.fleet.approx_sync import APPROX_STREAM


@pytest.fixture
async def approx_redis(private_redis_url: str) -> AsyncIterator[aioredis.Redis]:
    """A client of the module's own Redis; ``sy:approx`` is empty before the test and after it.
    Not the session's: a gateway of another test file on it writes its counts to the stream."""
    client = aioredis.Redis.from_url(private_redis_url)
    await client.delete(APPROX_STREAM)
    yield client
    await client.delete(APPROX_STREAM)
    await client.aclose()

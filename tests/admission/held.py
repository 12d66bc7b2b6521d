"""How many concurrency leases Redis counts for a tenant now (every replica's live count), and
request ids for the quota tests."""

from __future__ import annotations

import uuid

import redis as sync_redis
import redis.asyncio as aioredis

from admission.quota.store import num_held, quota_keys


def held(client: sync_redis.Redis, tenant: str) -> int:
    seconds, micros = client.time()
    return num_held(client.hgetall(quota_keys(tenant)[2]), seconds * 1_000_000 + micros)


async def held_async(client: aioredis.Redis, tenant: str) -> int:
    seconds, micros = await client.time()
    return num_held(await client.hgetall(quota_keys(tenant)[2]), seconds * 1_000_000 + micros)


def rid() -> str:
    """A fresh request id."""
    return uuid.uuid4().hex

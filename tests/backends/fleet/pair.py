"""Two replicas' ``ApproxIndexSync`` loops on one Redis, each knowing the other (so their
counts' changes go out), running until the block ends."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from typing import Any

import orjson
import redis.asyncio as aioredis

from backends.fleet.approx_sync import ApproxIndexSync
from backends.fleet.peer_load import PeerLoad
from backends.fleet.registry import BackendRegistry
from routing.index_approx import ApproxPrefixIndex


@contextlib.asynccontextmanager
async def two_replicas(redis: aioredis.Redis, registries: Sequence[BackendRegistry],
                       **options: Any) -> AsyncIterator[list[ApproxIndexSync]]:
    """gw-1 over ``registries[0]`` and gw-2 over ``registries[1]``; ``options`` go to both
    ``ApproxIndexSync``s."""
    syncs, tasks = [], []
    for name, other, registry in zip(("gw-1", "gw-2"), ("gw-2", "gw-1"), registries,
                                     strict=True):
        peers = PeerLoad(registry, name)
        peers.merge(other, orjson.dumps({}))  # each knows the other: changes go out
        sync = ApproxIndexSync(redis, ApproxPrefixIndex(ttl_s=60), name, ttl_s=60,
                               peers=peers, **options)
        await sync.catch_up()
        syncs.append(sync)
        tasks.append(asyncio.create_task(sync.run()))
    try:
        yield syncs
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait_for(task, 10)

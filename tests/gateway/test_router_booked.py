"""Which changes of a backend's books the router has the other replicas hear at once
(``Router.on_booked``): a dispatch, and a first token that takes a cache miss's prefill off the
books (``Router.falls_urgently``); the rest wait for company (``routing.share_lazy_ms``)."""

from __future__ import annotations

import asyncio
import time

import redis.asyncio as aioredis

from backends.fleet.approx_sync import APPROX_STREAM, URGENT_PREFILL_TOKENS
from backends.fleet.registry import Backend, BackendRegistry
from gateway.router import RoutePlan, Router
from gateway.settings import RoutingSettings
from routing import ApproxPrefixIndex, ExactPrefixIndex, profile_by_name
from routing.types import RouteRequest
from tests.backends.fleet.pair import two_replicas

MODEL = "m"


def _router(registry: BackendRegistry) -> Router:
    return Router(registry, profile_by_name("prefix_affinity"), ExactPrefixIndex(),
                  ApproxPrefixIndex(ttl_s=600), {})


def _registry() -> BackendRegistry:
    return BackendRegistry([Backend("w0", "http://127.0.0.1:19000", frozenset({MODEL}))])


def _plan(num_prompt_tokens: int = 2000) -> RoutePlan:
    return RoutePlan(RouteRequest(model=MODEL, num_prompt_tokens=num_prompt_tokens),
                     reserved_tokens=num_prompt_tokens + 100)


def test_a_miss_first_token_is_urgent_and_a_hit_first_token_is_not() -> None:
    registry = _registry()
    backend = registry.get("w0")
    assert backend is not None
    router = _router(registry)
    booked: list[bool] = []
    router.on_booked = booked.append
    miss, hit, failed = _plan(), _plan(), _plan()
    router.started(backend, miss)  # nothing expected cached: 2,000 tokens to prefill
    router.started(backend, hit, expected_cached_tokens=1950)  # 50
    router.started(backend, failed, expected_cached_tokens=1000)  # 1,000
    assert booked == [True, True, True]  # dispatches
    booked.clear()
    router.first_token(backend, hit)
    router.first_token(backend, miss)
    router.finished(backend, miss, had_first_token=True)  # its prefill already off the books
    router.finished(backend, failed, had_first_token=False)  # its 1,000 come off now
    router.finished(backend, hit, had_first_token=True)
    assert booked == [False, True, False, True, False]
    assert backend.num_in_flight == 0
    booked.clear()
    router.urgent_prefill_tokens = 0  # every first token at once
    router.started(backend, hit, expected_cached_tokens=1950)
    router.first_token(backend, hit)
    assert booked == [True, True]


async def test_the_other_replica_hears_a_miss_first_token_before_the_lazy_interval(
        redis_url: str) -> None:
    redis = aioredis.Redis.from_url(redis_url)
    await redis.delete(APPROX_STREAM)
    registries = [_registry(), _registry()]
    sender, seen = registries[0].get("w0"), registries[1].get("w0")
    assert sender is not None and seen is not None

    async def until(prompt_tokens: int, timeout_s: float) -> float:
        started_s = time.monotonic()
        while (time.monotonic() - started_s < timeout_s
               and seen.peer_in_flight_prompt_tokens != prompt_tokens):
            await asyncio.sleep(0.005)
        assert seen.peer_in_flight_prompt_tokens == prompt_tokens
        return time.monotonic() - started_s

    try:
        async with two_replicas(redis, registries, flush_interval_s=5.0,
                                lazy_interval_s=1.0) as syncs:
            router = _router(registries[0])
            router.on_booked = syncs[0].notify
            miss, hit = _plan(), _plan()
            router.started(sender, miss)
            router.started(sender, hit, expected_cached_tokens=1950)
            await until(2050, timeout_s=2.0)
            router.first_token(sender, hit)
            await asyncio.sleep(0.3)
            assert seen.peer_in_flight_prompt_tokens == 2050  # a hit's fall waits (1 s)
            router.first_token(sender, miss)  # a miss's goes at once, the hit's with it
            assert await until(0, timeout_s=0.5) < 0.5
    finally:
        await redis.delete(APPROX_STREAM)
        await redis.aclose()


def test_the_setting_defaults_to_the_routers_threshold() -> None:
    assert RoutingSettings().share_urgent_prefill_tokens == URGENT_PREFILL_TOKENS

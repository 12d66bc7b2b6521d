"""The admission benchmark's retrying clients against a real server on loopback that refuses
every request the first time it sees it, with a chosen ``Retry-After``, and answers it the
second time; and which clients retry, on hand-made values."""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from aiohttp import web

from bench.admission.load import TIERS, Mix, RetryPolicy, Workload, drive_with_retries
from gateway.cli.localproc import free_port

TENANTS = Mix().tenants
KEYS = {t: {tier: f"key-{t}-{tier}" for tier in TIERS} for t in TENANTS}
STREAM = (b'data: {"choices":[{"delta":{"content":"hi"}}]}\n\n'
          b'data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":1,'
          b'"prompt_tokens_details":{"cached_tokens":0}}}\n\ndata: [DONE]\n\n')


@contextmanager
def refusing_server(retry_after: str) -> Iterator[tuple[str, Counter[bytes]]]:
    """A chat endpoint that answers a body 503 (with ``retry_after``) the first time."""
    seen: Counter[bytes] = Counter()

    async def chat(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        seen[body] += 1
        if seen[body] == 1:
            return web.json_response({"error": {"message": "busy"}}, status=503,
                                     headers={"Retry-After": retry_after})
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(STREAM)
        return response

    port = free_port()
    loop = asyncio.new_event_loop()
    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    runner = web.AppRunner(app)
    loop.run_until_complete(runner.setup())
    loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", port).start())
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}/v1", seen
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(timeout=5)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=5)
        loop.close()


def test_refused_requests_of_retrying_tiers_are_retried_once_after_retry_after() -> None:
    policy = RetryPolicy(tiers=("interactive", "standard"), max_wait_s=1.0, drain_s=2.0)
    with refusing_server("0.3") as (url, seen):
        first, retries = drive_with_retries(url, "m", Workload(KEYS, Mix(), seed=1), policy,
                                            rate_per_s=40.0, send_s=0.5, drain_s=0.5)
    assert first and all(r.status == 503 and r.retry_after_s == 0.3 for r in first)
    retried = {r.index for r in first if r.tier != "batch"}
    assert set(retries) == retried and retried
    assert all(r.is_ok and r.phase == 1 and r.ttft_s is not None for r in retries.values())
    for r in first:
        if r.index in retries:  # 0.3 s after the refusal, to the event loop's 1-ms timers
            refused_at_s = r.sent_at_s + (r.e2e_s or 0.0)
            assert retries[r.index].sent_at_s >= refused_at_s + 0.3 - 0.002
            assert -0.002 <= retries[r.index].lag_s < 0.25
    assert max(seen.values()) == 2  # never a second retry


def test_a_retry_after_over_the_cap_is_given_up() -> None:
    policy = RetryPolicy(max_wait_s=1.0, drain_s=1.0)
    with refusing_server("5") as (url, _):
        first, retries = drive_with_retries(url, "m", Workload(KEYS, Mix(), seed=1), policy,
                                            rate_per_s=20.0, send_s=0.3, drain_s=0.3)
    assert first and all(r.retry_after_s == 5.0 for r in first)
    assert retries == {}


@pytest.mark.parametrize(("policy", "tier", "expected"), [
    pytest.param(RetryPolicy(), "interactive", True, id="interactive-retries"),
    pytest.param(RetryPolicy(), "standard", True, id="standard-retries"),
    pytest.param(RetryPolicy(), "batch", False, id="batch-does-not"),
    pytest.param(RetryPolicy(fraction=0.0), "interactive", False, id="fraction-zero"),
])
def test_is_retrying(policy: RetryPolicy, tier: str, expected: bool) -> None:
    assert all(policy.is_retrying(t, tier) is expected for t in TENANTS)


def test_a_fraction_of_the_clients_retries_and_always_the_same_ones() -> None:
    policy = RetryPolicy(tiers=("standard",), fraction=0.5, seed=3)
    chosen = [t for t in TENANTS if policy.is_retrying(t, "standard")]
    assert 0 < len(chosen) < len(TENANTS)
    assert chosen == [t for t in TENANTS if policy.is_retrying(t, "standard")]

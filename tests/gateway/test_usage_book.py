"""The usage book against a real redis-server: exact sums, cost at the configured prices, a
batch applied at most once, and charges that wait out a Redis outage and are not lost."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import redis.asyncio as aioredis

from gateway.cli.localproc import ProcessGroup, free_port, start_redis
from gateway.settings import PriceSettings, UsageSettings
from gateway.usage import BUCKET_S, UsageBook, _Batch, cost_nano, totals, usage_key

T0 = 1_764_756_000.0  # an hour boundary


def test_cost_in_nano_units_with_cached_tokens_at_their_own_price() -> None:
    price = PriceSettings(prompt=2.0, cached=0.5, output=8.0)
    # 600 uncached * 2 + 400 cached * 0.5 + 100 output * 8, per million, in 1e-9 units.
    assert cost_nano(price, 1000, 400, 100) == 1000 * (600 * 2.0 + 400 * 0.5 + 100 * 8.0)
    assert cost_nano(PriceSettings(prompt=2.0), 1000, 400, 0) == 1000 * 1000 * 2.0


def test_memory_book_sums_by_tenant_key_model_and_hour() -> None:
    now = [T0 + 10]
    book = UsageBook(None, UsageSettings(prices={"m": PriceSettings(prompt=1.0, output=2.0)}),
                     clock=lambda: now[0])
    book.charge("a", "k1", "m", prompt_tokens=100, cached_tokens=20, output_tokens=5)
    book.charge("a", "k1", "m", prompt_tokens=50, cached_tokens=0, output_tokens=5)
    book.charge("a", "k2", "other", prompt_tokens=7, cached_tokens=0, output_tokens=1)
    now[0] = T0 + BUCKET_S + 1  # the next hour
    book.charge("b", "k3", "m", prompt_tokens=1, cached_tokens=0, output_tokens=1)

    rows = asyncio.run(book.query(["a", "b"], T0, T0 + BUCKET_S))
    assert [(r.tenant, r.key_id, r.model, r.requests, r.prompt_tokens, r.cached_tokens,
             r.output_tokens) for r in rows] == [
        ("a", "k1", "m", 2, 150, 20, 10), ("a", "k2", "other", 1, 7, 0, 1)]
    assert rows[0].cost_nano == 1000 * (150 * 1.0 + 10 * 2.0)
    assert rows[1].cost_nano == 0  # no price for the model: it costs nothing
    both_hours = asyncio.run(book.query(["a", "b"], T0, T0 + 2 * BUCKET_S))
    assert totals(both_hours).requests == 4
    assert asyncio.run(book.query(["b"], T0, T0 + BUCKET_S)) == []


def test_redis_book_is_exact_and_applies_a_retried_batch_once(tmp_path: Path) -> None:
    async def scenario(redis_url: str) -> None:
        redis = aioredis.Redis.from_url(redis_url)
        replicas = [UsageBook(redis, clock=lambda: T0 + 5) for _ in range(2)]
        for index in range(200):  # two replicas charge the same tenant, key and model
            replicas[index % 2].charge("t", "k", "m", prompt_tokens=10, cached_tokens=3,
                                       output_tokens=index)
        assert all([await book.flush() for book in replicas])
        rows = await replicas[0].query(["t"], T0, T0 + 60)
        assert [(r.requests, r.prompt_tokens, r.cached_tokens, r.output_tokens)
                for r in rows] == [(200, 2000, 600, sum(range(200)))]

        # A flush whose reply was lost is sent again under the same batch id: counted once.
        book = replicas[1]
        batch = _Batch("t", int(T0 // BUCKET_S), {"k\x1fm\x1frequests": 1})
        book._unsent = [batch]
        assert await book.flush()
        book._unsent = [batch]
        assert await book.flush()
        assert (await book.query(["t"], T0, T0 + 60))[0].requests == 201
        ttl = await redis.ttl(usage_key("t", int(T0 // BUCKET_S)))
        assert 0 < ttl <= 90 * 86_400
        await redis.aclose()

    with ProcessGroup() as group:
        asyncio.run(scenario(start_redis(group, tmp_path)))


def test_charges_wait_out_a_redis_outage(tmp_path: Path) -> None:
    port = free_port()

    async def charge_and_fail(book: UsageBook) -> None:
        book.charge("t", "k", "m", prompt_tokens=4, cached_tokens=0, output_tokens=2)
        assert not await book.flush()  # Redis is down: nothing applied, nothing lost
        book.charge("t", "k", "m", prompt_tokens=4, cached_tokens=0, output_tokens=2)
        assert book.num_flush_failures == 1 and book.num_pending_fields == 6

    async def recover(book: UsageBook) -> None:
        assert await book.flush()
        rows = await book.query(["t"], T0, T0 + 60)
        assert [(r.requests, r.prompt_tokens, r.output_tokens) for r in rows] == [(2, 8, 4)]
        assert book.num_pending_fields == 0

    async def scenario() -> None:
        redis = aioredis.Redis.from_url(f"redis://127.0.0.1:{port}/0", socket_timeout=0.5,
                                        socket_connect_timeout=0.5)
        book = UsageBook(redis, clock=lambda: T0 + 5)
        with ProcessGroup() as group:
            start_redis(group, tmp_path, port)
            process = group.children[-1][1]
            await book.flush()  # connected once
            process.send_signal(signal.SIGKILL)
            process.wait()
            await charge_and_fail(book)
            start_redis(group, tmp_path, port)
            await recover(book)
        await redis.aclose()

    asyncio.run(scenario())

"""The mock engine's fault injection and pacing: injected errors, cut streams, hangs, delays,
clients that go away."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time

import aiohttp
import pytest

from backends.mock import MockEngine, MockEngineConfig, start
from tests.backends.mock.support import (
    CHAT,
    MODEL,
    chat_body,
    post_json,
    wait_until,
)


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("status", "error_type"),
    [
        pytest.param(429, "rate_limit_error", id="429"),
        pytest.param(500, "server_error", id="500"),
        pytest.param(503, "server_error", id="503"),
    ],
)
@pytest.mark.parametrize("is_stream", [False, True], ids=["whole", "stream"])
async def test_mock_status_injects_an_error(
    engine: MockEngine,
    session: aiohttp.ClientSession,
    status: int,
    error_type: str,
    is_stream: bool,
) -> None:
    body = chat_body(stream=is_stream, mock={"status": status})
    got_status, got = await post_json(session, engine, CHAT, body)

    assert got_status == status
    assert got["error"]["type"] == error_type
    assert got["error"]["code"] == "mock_injected"


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("die_after_chunks", "num_events"),
    [
        pytest.param(0, 0, id="after-headers"),
        pytest.param(2, 2, id="mid-stream"),
        pytest.param(99, 6, id="before-done"),
    ],
)
async def test_die_after_chunks_cuts_the_stream(
    engine: MockEngine, session: aiohttp.ClientSession, die_after_chunks: int, num_events: int
) -> None:
    body = chat_body(max_tokens=4, stream=True, mock={"die_after_chunks": die_after_chunks})
    events: list[bytes] = []
    with pytest.raises(aiohttp.ClientPayloadError):
        async with session.post(engine.url + CHAT, json=body) as resp:
            assert resp.status == 200
            async for line in resp.content:
                if line.startswith(b"data: "):
                    events.append(line)

    assert len(events) == num_events
    assert b"data: [DONE]\n" not in events
    await wait_until(lambda stats: stats.in_flight == 0, engine.stats)
    assert engine.stats.requests_aborted == 1


@pytest.mark.asyncio
async def test_die_after_chunks_drops_a_whole_response_before_any_byte(
    engine: MockEngine, session: aiohttp.ClientSession
) -> None:
    body = chat_body(mock={"die_after_chunks": 0})
    with pytest.raises(aiohttp.ServerDisconnectedError):
        await post_json(session, engine, CHAT, body)
    assert engine.stats.requests_aborted == 1


@pytest.mark.asyncio
async def test_hang_delays_headers_and_counts_as_waiting(
    engine: MockEngine, session: aiohttp.ClientSession
) -> None:
    body = chat_body(mock={"hang_ms": 300})
    started_s = time.monotonic()
    request = asyncio.create_task(post_json(session, engine, CHAT, body))
    await wait_until(lambda stats: stats.num_waiting_by_model.get(MODEL) == 1, engine.stats)
    async with session.get(engine.url + "/metrics") as resp:
        metrics = await resp.text()
    status, _ = await request

    assert status == 200
    assert time.monotonic() - started_s >= 0.3
    assert f'vllm:num_requests_waiting{{model_name="{MODEL}"}} 1\n' in metrics


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("source", "first_token_delay_ms", "token_delay_ms"),
    [
        pytest.param("config", 120.0, 40.0, id="config"),
        pytest.param("request", 150.0, 30.0, id="request-overrides-config"),
    ],
)
async def test_stream_paces_first_token_and_later_tokens(
    session: aiohttp.ClientSession, source: str, first_token_delay_ms: float, token_delay_ms: float
) -> None:
    config = MockEngineConfig(first_token_delay_ms=1, token_delay_ms=1)
    body = chat_body(max_tokens=4, stream=True)
    if source == "config":
        config = MockEngineConfig(
            first_token_delay_ms=first_token_delay_ms, token_delay_ms=token_delay_ms
        )
    else:
        body["mock"] = {
            "first_token_delay_ms": first_token_delay_ms,
            "token_delay_ms": token_delay_ms,
        }
    arrivals_s: list[float] = []
    async with await start(config) as engine:
        started_s = time.monotonic()
        async with session.post(engine.url + CHAT, json=body) as resp:
            async for line in resp.content:
                if line.startswith(b"data: {"):
                    arrivals_s.append(time.monotonic() - started_s)

    first_content_s = arrivals_s[1]  # after the role chunk
    gaps_s = [later - earlier for earlier, later in itertools.pairwise(arrivals_s[1:5])]
    assert first_content_s >= first_token_delay_ms / 1000
    assert min(gaps_s) >= token_delay_ms / 1000 * 0.9
    assert max(gaps_s) < first_token_delay_ms / 1000  # no first-token delay repeated


@pytest.mark.asyncio
async def test_whole_response_waits_first_token_plus_every_token(
    engine: MockEngine, session: aiohttp.ClientSession
) -> None:
    body = chat_body(max_tokens=3, mock={"first_token_delay_ms": 100, "token_delay_ms": 50})
    started_s = time.monotonic()
    status, _ = await post_json(session, engine, CHAT, body)

    assert status == 200
    assert time.monotonic() - started_s >= 0.25


@pytest.mark.asyncio
@pytest.mark.parametrize("is_stream", [False, True], ids=["whole", "stream"])
async def test_client_going_away_is_counted_as_cancelled(
    engine: MockEngine, is_stream: bool
) -> None:
    body = chat_body(stream=is_stream, max_tokens=50, mock={"token_delay_ms": 200})
    async with aiohttp.ClientSession() as session:

        async def read_all() -> None:
            async with session.post(engine.url + CHAT, json=body) as resp:
                await resp.read()

        request = asyncio.create_task(read_all())
        await wait_until(lambda stats: stats.num_running_by_model.get(MODEL) == 1, engine.stats)
        await asyncio.sleep(0.05)  # a streamed response is under way by now
        request.cancel()  # the client gives up and drops its connection
        with contextlib.suppress(asyncio.CancelledError):
            await request

    await wait_until(lambda stats: stats.in_flight == 0, engine.stats)
    assert engine.stats.requests_cancelled == 1
    assert engine.stats.requests_completed == 0
    assert engine.stats.num_running_by_model[MODEL] == 0

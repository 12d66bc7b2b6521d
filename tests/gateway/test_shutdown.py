"""Graceful shutdown: on SIGTERM the gateway stops accepting, finishes open streams, exits 0."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai
import pytest

from gateway.cli.localproc import ProcessGroup
from tests.fleet import MODEL, Engine, Gateway, process_group, wait_until

NUM_STREAMS = 20
NUM_TOKENS = 10
TOKEN_DELAY_MS = 200  # each stream lasts about 2 s
MESSAGES = [{"role": "user", "content": "drain me"}]
EXPECTED_TEXT = " drain me" * (NUM_TOKENS // 2)


@dataclass(slots=True)
class StreamResult:
    text: str
    finish_reason: str | None
    is_done_seen: bool  # only a raw SSE reader can see "[DONE]"; the SDK swallows it


@pytest.fixture
def own_group() -> Iterator[ProcessGroup]:
    """A process group of its own: the gateway exits here, which the session group would mind."""
    with process_group() as group:
        yield group


def is_refused(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return False
    except ConnectionRefusedError:
        return True
    except OSError:  # reset or timed out: it reached the listener just as it closed; try again
        return False


async def sdk_stream(client: openai.AsyncOpenAI, on_first_chunk: asyncio.Semaphore
                     ) -> StreamResult:
    stream = await client.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=NUM_TOKENS, stream=True,
        extra_body={"mock": {"token_delay_ms": TOKEN_DELAY_MS}},
    )
    text, finish_reason, num_chunks = "", None, 0
    async for chunk in stream:
        num_chunks += 1
        if num_chunks == 1:
            on_first_chunk.release()
        text += chunk.choices[0].delta.content or ""
        finish_reason = chunk.choices[0].finish_reason or finish_reason
    return StreamResult(text, finish_reason, is_done_seen=False)


async def raw_stream(client: httpx.AsyncClient, on_first_chunk: asyncio.Semaphore
                     ) -> StreamResult:
    body = {"model": MODEL, "messages": MESSAGES, "max_tokens": NUM_TOKENS, "stream": True,
            "mock": {"token_delay_ms": TOKEN_DELAY_MS}}
    text, finish_reason, events = "", None, []
    async with client.stream("POST", "/v1/chat/completions", json=body) as response:
        assert response.status_code == 200
        async for line in response.aiter_lines():
            if not line.startswith("data: "):
                continue
            if not events:
                on_first_chunk.release()
            events.append(line.removeprefix("data: "))
    for data in events[:-1]:
        choice = json.loads(data)["choices"][0]
        text += choice["delta"].get("content") or ""
        finish_reason = choice["finish_reason"] or finish_reason
    return StreamResult(text, finish_reason, is_done_seen=events[-1] == "[DONE]")


async def test_sigterm_lets_open_streams_finish(
    own_group: ProcessGroup, workdir: Path, redis_url: str, engines: list[Engine], api_key: str
) -> None:
    gateway = Gateway(own_group, workdir, redis_url, [e.backend_config() for e in engines])
    first_chunks = asyncio.Semaphore(0)
    headers = {"Authorization": f"Bearer {api_key}"}
    async with openai.AsyncOpenAI(base_url=gateway.url + "/v1", api_key=api_key,
                                  max_retries=0, timeout=20) as sdk, \
            httpx.AsyncClient(base_url=gateway.url, headers=headers, timeout=20) as raw:
        tasks = [
            asyncio.create_task(
                sdk_stream(sdk, first_chunks) if index % 2 else raw_stream(raw, first_chunks)
            )
            for index in range(NUM_STREAMS)
        ]
        try:
            for _ in range(NUM_STREAMS):
                await asyncio.wait_for(first_chunks.acquire(), timeout=5)

            gateway.terminate()
            signalled_at = time.monotonic()

            assert await asyncio.to_thread(wait_until, lambda: is_refused(gateway.port), 1.0)
            assert not any(task.done() for task in tasks), "streams must still be open here"
            results = await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()

    assert [r.text for r in results] == [EXPECTED_TEXT] * NUM_STREAMS
    assert [r.finish_reason for r in results] == ["length"] * NUM_STREAMS
    assert [r.is_done_seen for r in results[0::2]] == [True] * (NUM_STREAMS // 2)
    exit_status = await asyncio.to_thread(gateway.process.wait, 10)
    assert exit_status == 0
    # The drain ended with the last stream, not at drain_timeout_s (30 s by default).
    assert time.monotonic() - signalled_at < 5


async def raw_events(client: httpx.AsyncClient, on_first_chunk: asyncio.Semaphore
                     ) -> list[dict[str, object]]:
    """Every ``data:`` event of one stream, decoded (``[DONE]`` as the string)."""
    body = {"model": MODEL, "messages": MESSAGES, "max_tokens": NUM_TOKENS, "stream": True,
            "mock": {"token_delay_ms": TOKEN_DELAY_MS}}
    events: list[dict[str, object]] = []
    async with client.stream("POST", "/v1/chat/completions", json=body) as response:
        assert response.status_code == 200
        async for line in response.aiter_lines():
            if line.startswith("data: "):
                if not events:
                    on_first_chunk.release()
                data = line.removeprefix("data: ")
                events.append({"done": True} if data == "[DONE]" else json.loads(data))
    return events


@pytest.mark.parametrize("drain_timeout_s", [
    pytest.param(0.0, id="no-drain"),
    pytest.param(0.5, id="drain-shorter-than-streams"),
])
async def test_streams_outliving_the_drain_end_with_an_error_event(
    own_group: ProcessGroup, workdir: Path, redis_url: str, engines: list[Engine], api_key: str,
    drain_timeout_s: float,
) -> None:
    gateway = Gateway(own_group, workdir, redis_url, [e.backend_config() for e in engines],
                      drain_timeout_s=drain_timeout_s)
    first_chunks = asyncio.Semaphore(0)
    headers = {"Authorization": f"Bearer {api_key}"}
    async with httpx.AsyncClient(base_url=gateway.url, headers=headers, timeout=20) as raw:
        tasks = [asyncio.create_task(raw_events(raw, first_chunks)) for _ in range(4)]
        for _ in tasks:
            await asyncio.wait_for(first_chunks.acquire(), timeout=5)

        gateway.terminate()
        signalled_at = time.monotonic()
        results = await asyncio.gather(*tasks)
        ended_after_s = time.monotonic() - signalled_at

    for events in results:
        last = events[-1]
        assert "choices" in events[0] and isinstance(last.get("error"), dict), events[-2:]
        error = last["error"]
        assert isinstance(error, dict) and error["code"] == "gateway_shutting_down"
        assert "retry the request" in str(error["message"])
    assert drain_timeout_s <= ended_after_s < drain_timeout_s + 1.0
    assert await asyncio.to_thread(gateway.process.wait, 10) == 0
    exited_after_s = time.monotonic() - signalled_at
    assert exited_after_s < drain_timeout_s + 2.5  # not twice the drain

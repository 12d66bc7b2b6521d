"""The mock engine, served for real on loopback and driven by aiohttp and the openai SDK."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from typing import Any

import aiohttp
import openai
import orjson
import pytest

from backends.mock import MockEngine
from tests.backends.mock.support import (
    CHAT,
    CONFIG,
    MODEL,
    OTHER_MODEL,
    REPO_ROOT,
    TEXT,
    chat_body,
    post_json,
    post_stream,
)


@pytest.mark.asyncio
async def test_chat_completion_echoes_last_user_message_cyclically(
    engine: MockEngine, session: aiohttp.ClientSession
) -> None:
    status, body = await post_json(session, engine, CHAT, chat_body(max_tokens=5))

    assert status == 200
    assert body["id"].startswith("chatcmpl-")
    assert body["object"] == "chat.completion"
    assert body["model"] == MODEL
    assert abs(body["created"] - time.time()) < 5
    assert body["choices"] == [
        {
            "index": 0,
            "message": {"role": "assistant", "content": " hello there world hello there"},
            "logprobs": None,
            "finish_reason": "length",
        }
    ]
    assert body["usage"] == {
        "prompt_tokens": 5,  # every message's words: "be brief" + "hello there world"
        "completion_tokens": 5,
        "total_tokens": 10,
        "prompt_tokens_details": {"cached_tokens": 0},
    }


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("messages", "content", "num_prompt_tokens"),
    [
        pytest.param(
            [
                {"role": "user", "content": "a b"},
                {"role": "assistant", "content": "c"},
                {"role": "user", "content": "d e"},
            ],
            " d e d",
            5,
            id="last-user-message",
        ),
        pytest.param(
            [{"role": "user", "content": "a b"}, {"role": "assistant", "content": None}],
            " a b a",
            2,
            id="user-before-assistant",
        ),
        pytest.param([{"role": "system", "content": "s t"}], " ok ok ok", 2, id="no-user"),
        pytest.param(
            [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "p q"},
                        {"type": "image_url", "image_url": {"url": "data:,"}},
                    ],
                }
            ],
            " p q p",
            2,
            id="content-parts",
        ),
    ],
)
async def test_chat_output_comes_from_the_last_user_message(
    engine: MockEngine,
    session: aiohttp.ClientSession,
    messages: list[dict[str, Any]],
    content: str,
    num_prompt_tokens: int,
) -> None:
    body = {"model": MODEL, "messages": messages, "max_tokens": 3}
    _, got = await post_json(session, engine, CHAT, body)

    assert got["choices"][0]["message"]["content"] == content
    assert got["usage"]["prompt_tokens"] == num_prompt_tokens


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("prompt", "text", "num_prompt_tokens"),
    [
        pytest.param("a b", " a b a", 2, id="string"),
        pytest.param(["x y z", "ignored"], " x y z", 3, id="list-of-strings"),
        pytest.param([7, 8], " 7 8 7", 2, id="token-ids"),
        pytest.param([[5], [6, 6]], " 5 5 5", 1, id="list-of-token-id-lists"),
        pytest.param("", " ok ok ok", 0, id="empty"),
    ],
)
async def test_text_completion_accepts_every_prompt_shape(
    engine: MockEngine,
    session: aiohttp.ClientSession,
    prompt: Any,
    text: str,
    num_prompt_tokens: int,
) -> None:
    body = {"model": OTHER_MODEL, "prompt": prompt, "max_tokens": 3}
    status, got = await post_json(session, engine, TEXT, body)

    assert status == 200
    assert got["id"].startswith("cmpl-")
    assert got["object"] == "text_completion"
    assert got["model"] == OTHER_MODEL
    assert got["choices"] == [
        {"index": 0, "text": text, "logprobs": None, "finish_reason": "length"}
    ]
    assert got["usage"]["prompt_tokens"] == num_prompt_tokens
    assert got["usage"]["total_tokens"] == num_prompt_tokens + 3


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("limits", "num_tokens", "finish_reason"),
    [
        pytest.param({}, CONFIG.default_max_tokens, "stop", id="engine-default"),
        pytest.param({"max_tokens": 2}, 2, "length", id="max_tokens"),
        pytest.param(
            {"max_tokens": 2, "max_completion_tokens": 6}, 6, "length", id="max_completion_tokens"
        ),
    ],
)
async def test_output_length_follows_the_client_limit(
    engine: MockEngine,
    session: aiohttp.ClientSession,
    limits: dict[str, int],
    num_tokens: int,
    finish_reason: str,
) -> None:
    _, body = await post_json(session, engine, CHAT, chat_body("w", unknown_field=[1], **limits))

    assert body["choices"][0]["message"]["content"] == " w" * num_tokens
    assert body["choices"][0]["finish_reason"] == finish_reason
    assert body["usage"]["completion_tokens"] == num_tokens


@pytest.mark.asyncio
@pytest.mark.parametrize("include_usage", [False, True], ids=["no-usage", "include-usage"])
async def test_chat_stream_sends_role_tokens_finish_and_done(
    engine: MockEngine, session: aiohttp.ClientSession, include_usage: bool
) -> None:
    body = chat_body("p q", max_tokens=3, stream=True)
    body["stream_options"] = {"include_usage": include_usage}
    events = await post_stream(session, engine, CHAT, body)

    assert events[-1] == b"[DONE]"
    chunks = [orjson.loads(event) for event in events[:-1]]
    assert len({chunk["id"] for chunk in chunks}) == 1
    assert chunks[0]["id"].startswith("chatcmpl-")
    assert {chunk["object"] for chunk in chunks} == {"chat.completion.chunk"}
    deltas = [(c["choices"][0]["delta"], c["choices"][0]["finish_reason"]) for c in chunks[:5]]
    assert deltas == [
        ({"role": "assistant", "content": ""}, None),
        ({"content": " p"}, None),
        ({"content": " q"}, None),
        ({"content": " p"}, None),
        ({}, "length"),
    ]
    if include_usage:
        assert all(chunk["usage"] is None for chunk in chunks[:5])
        assert chunks[5]["choices"] == []
        assert chunks[5]["usage"]["total_tokens"] == 4 + 3
        assert len(chunks) == 6
    else:
        assert all("usage" not in chunk for chunk in chunks)
        assert len(chunks) == 5


@pytest.mark.asyncio
async def test_text_stream_sends_one_event_per_token(
    engine: MockEngine, session: aiohttp.ClientSession
) -> None:
    body = {"model": MODEL, "prompt": "a b", "max_tokens": 3, "stream": True}
    events = await post_stream(session, engine, TEXT, body)

    chunks = [orjson.loads(event) for event in events[:-1]]
    assert events[-1] == b"[DONE]"
    assert {chunk["object"] for chunk in chunks} == {"text_completion"}
    texts = [(c["choices"][0]["text"], c["choices"][0]["finish_reason"]) for c in chunks]
    assert texts == [(" a", None), (" b", None), (" a", None), ("", "length")]


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("path", "raw_body", "status", "param", "code"),
    [
        pytest.param(CHAT, b"{not json", 400, None, None, id="malformed-json"),
        pytest.param(CHAT, b"[1, 2]", 400, None, None, id="not-an-object"),
        pytest.param(CHAT, {"messages": []}, 400, "model", None, id="missing-model"),
        pytest.param(
            CHAT, chat_body() | {"model": "gpt-9"}, 404, "model", "model_not_found", id="bad-model"
        ),
        pytest.param(CHAT, {"model": MODEL}, 400, "messages", None, id="missing-messages"),
        pytest.param(CHAT, {"model": MODEL, "messages": ["hi"]}, 400, "messages", None, id="msg"),
        pytest.param(TEXT, {"model": MODEL}, 400, "prompt", None, id="missing-prompt"),
        pytest.param(TEXT, {"model": MODEL, "prompt": [1, "a"]}, 400, "prompt", None, id="mixed"),
        pytest.param(CHAT, chat_body(stream="yes"), 400, "stream", None, id="stream-not-bool"),
        pytest.param(CHAT, chat_body(max_tokens=0), 400, "max_tokens", None, id="max-tokens-0"),
        pytest.param(CHAT, chat_body(mock=[1]), 400, "mock", None, id="mock-not-object"),
        pytest.param(CHAT, chat_body(mock={"status": 200}), 400, "mock", None, id="mock-200"),
        pytest.param(CHAT, chat_body(mock={"hang_ms": "1"}), 400, "mock", None, id="mock-hang"),
    ],
)
async def test_invalid_requests_get_openai_errors(
    engine: MockEngine,
    session: aiohttp.ClientSession,
    path: str,
    raw_body: bytes | dict[str, Any],
    status: int,
    param: str | None,
    code: str | None,
) -> None:
    data = raw_body if isinstance(raw_body, bytes) else orjson.dumps(raw_body)
    async with session.post(engine.url + path, data=data) as resp:
        body = await resp.json()

    assert resp.status == status
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["type"] == "invalid_request_error"
    assert (body["error"]["param"], body["error"]["code"]) == (param, code)
    assert body["error"]["message"]
    assert engine.stats.requests_completed == 1


@pytest.mark.asyncio
async def test_models_health_and_metrics(
    engine: MockEngine, session: aiohttp.ClientSession
) -> None:
    await post_json(session, engine, CHAT, chat_body(max_tokens=1))
    async with session.get(engine.url + "/v1/models") as resp:
        models = await resp.json()
    async with session.get(engine.url + "/health") as resp:
        health = (resp.status, await resp.json())
    async with session.get(engine.url + "/metrics") as resp:
        metrics_type = resp.headers["Content-Type"]
        metric_lines = (await resp.text()).splitlines()

    assert models["object"] == "list"
    assert [(m["id"], m["object"], m["owned_by"]) for m in models["data"]] == [
        (MODEL, "model", "switchyard"),
        (OTHER_MODEL, "model", "switchyard"),
    ]
    assert all(isinstance(m["created"], int) for m in models["data"])
    assert health == (200, {"status": "ok"})
    assert metrics_type.startswith("text/plain")
    assert "# TYPE vllm:num_requests_running gauge" in metric_lines
    assert "# TYPE vllm:request_success_total counter" in metric_lines
    assert f'vllm:num_requests_running{{model_name="{OTHER_MODEL}"}} 0' in metric_lines
    success = f'vllm:request_success_total{{finished_reason="length",model_name="{MODEL}"}} 1'
    assert success in metric_lines


@pytest.mark.asyncio
async def test_mock_stats_reports_the_last_request_and_reset_zeroes_it(
    engine: MockEngine, session: aiohttp.ClientSession
) -> None:
    body = chat_body(max_tokens=1, user="u-7")
    async with session.post(engine.url + CHAT, json=body, headers={"X-Trace-Id": "t-1"}):
        pass
    async with session.get(engine.url + "/mock/stats") as resp:
        stats = await resp.json()
    async with session.post(engine.url + "/mock/reset") as resp:
        assert resp.status == 200
    async with session.get(engine.url + "/mock/stats") as resp:
        after_reset = await resp.json()

    assert stats["last_headers"]["x-trace-id"] == "t-1"
    assert stats["last_body"] == body
    assert {key: stats[key] for key in ("requests_started", "requests_completed", "in_flight")} == {
        "requests_started": 1,
        "requests_completed": 1,
        "in_flight": 0,
    }
    assert after_reset["requests_started"] == 0
    assert after_reset["requests_completed"] == 0
    assert after_reset["last_body"] is None


@pytest.mark.asyncio
async def test_server_sockets_have_tcp_nodelay(
    engine: MockEngine, session: aiohttp.ClientSession
) -> None:
    await post_json(session, engine, CHAT, chat_body(max_tokens=1))  # keeps one connection open
    server = engine._runner.server
    assert server is not None and server.connections
    for handler in server.connections:
        assert handler.transport is not None
        sock = handler.transport.get_extra_info("socket")
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0


@pytest.mark.asyncio
async def test_openai_async_sdk_streams(engine: MockEngine) -> None:
    client = openai.AsyncOpenAI(base_url=engine.url + "/v1", api_key="unused", max_retries=0)
    async with client:
        stream = await client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "one two"}],
            max_tokens=3,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = [chunk async for chunk in stream]

    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == " one two one"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 3


def test_cli_serves_the_openai_sync_sdk_and_stops_on_sigterm() -> None:
    command = [sys.executable, "-m", "backends.mock", "--port", "0", "--model", "m1"]
    command += ["--model", "m2", "--token-delay-ms", "1"]
    with subprocess.Popen(command, cwd=REPO_ROOT, stdout=subprocess.PIPE, text=True) as process:
        try:
            assert process.stdout is not None
            line = process.stdout.readline().strip()
            assert line.startswith("mock engine listening on http://127.0.0.1:")
            base_url = line.split()[-1] + "/v1"
            with openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0) as client:
                completion = client.completions.create(model="m2", prompt="a b c", max_tokens=4)
                stream = client.chat.completions.create(
                    model="m1",
                    messages=[{"role": "user", "content": "x"}],
                    max_tokens=2,
                    stream=True,
                )
                streamed = "".join(chunk.choices[0].delta.content or "" for chunk in stream)
                with pytest.raises(openai.NotFoundError):
                    client.completions.create(model="m3", prompt="a")
            process.send_signal(signal.SIGTERM)
            assert process.wait(timeout=10) == 0
        finally:
            if process.poll() is None:
                process.kill()

    assert completion.choices[0].text == " a b c a"
    assert completion.usage is not None and completion.usage.prompt_tokens == 3
    assert streamed == " x x"

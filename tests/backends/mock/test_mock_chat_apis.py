"""The mock engine's Anthropic Messages and OpenAI Responses, served on loopback and driven by
the official async SDKs: the chat path's generation and counts, its ``"mock"`` controls, and
each API's error shape."""

from __future__ import annotations

import time
from typing import Any

import aiohttp
import anthropic
import openai
import orjson
import pytest

from backends.mock import MockEngine
from tests.backends.chat_api_checks import (
    API_ERRORS,
    COUNT_TOKENS,
    MESSAGES,
    RESPONSES,
    check_api_error,
    check_messages_events,
    check_responses_events,
    message_text,
    with_model,
)
from tests.backends.mock.support import CHAT, MODEL, chat_body, post_json

SYSTEM = "be brief"
QUESTION = "hello there world"


def _anthropic(engine: MockEngine) -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(base_url=engine.url, api_key="unused", max_retries=0)


def _openai(engine: MockEngine) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=engine.url + "/v1", api_key="unused", max_retries=0)


def _messages_body(**extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "max_tokens": 5, "system": SYSTEM,
            "messages": [{"role": "user", "content": QUESTION}], **extra}


async def test_messages_answer_as_chat_does(
        engine: MockEngine, session: aiohttp.ClientSession) -> None:
    _, chat = await post_json(session, engine, CHAT, chat_body(QUESTION, max_tokens=5))
    client = _anthropic(engine)
    message = await client.messages.create(**_messages_body())
    text = message_text(message)
    assert text == chat["choices"][0]["message"]["content"]
    assert message.stop_reason == "max_tokens" and message.model == MODEL
    assert message.usage.input_tokens == chat["usage"]["prompt_tokens"] == 5
    assert message.usage.output_tokens == 5 and message.usage.cache_read_input_tokens == 0
    counted = await client.messages.count_tokens(model=MODEL, system=SYSTEM,
                                                 messages=[{"role": "user", "content": QUESTION}])
    assert counted.input_tokens == 5
    async with client.messages.stream(**_messages_body()) as stream:
        streamed = "".join([delta async for delta in stream.text_stream])
        final = await stream.get_final_message()
    assert streamed == text
    assert final.usage.input_tokens == 5 and final.usage.output_tokens == 5
    events = await client.messages.create(**_messages_body(stream=True))
    assert check_messages_events([event.type async for event in events]) == 5
    # The mock records what it got, as on chat.
    assert engine.stats.last_body == _messages_body(stream=True)
    assert engine.stats.last_headers is not None
    assert "anthropic-version" in engine.stats.last_headers


@pytest.mark.parametrize(("max_output_tokens", "status", "num_output_tokens"), [
    pytest.param(3, "incomplete", 3, id="at-max-output-tokens"),
    pytest.param(None, "completed", 4, id="stops-on-its-own"),  # the default length, 4
])
async def test_responses_answer_as_chat_does(
        engine: MockEngine, max_output_tokens: int | None, status: str,
        num_output_tokens: int) -> None:
    client = _openai(engine)
    response = await client.responses.create(model=MODEL, instructions=SYSTEM, input=QUESTION,
                                             max_output_tokens=max_output_tokens)
    assert response.status == status
    words = QUESTION.split()  # the mock echoes the last user message
    assert response.output_text == "".join(" " + words[i % len(words)]
                                           for i in range(num_output_tokens))
    assert response.usage is not None and response.usage.input_tokens == 5
    assert response.usage.output_tokens == num_output_tokens
    assert response.usage.input_tokens_details.cached_tokens == 0
    stream = await client.responses.create(model=MODEL, instructions=SYSTEM, input=QUESTION,
                                           max_output_tokens=max_output_tokens, stream=True)
    events = [event async for event in stream]
    assert check_responses_events(events, f"response.{status}") == response.output_text


@pytest.mark.parametrize(("path", "body", "status", "param"), API_ERRORS)
async def test_errors_are_in_each_apis_shape(
        engine: MockEngine, session: aiohttp.ClientSession, path: str, body: Any, status: int,
        param: str | None) -> None:
    body = with_model(body, MODEL)
    data = body if isinstance(body, bytes) else orjson.dumps(body)
    async with session.post(engine.url + path, data=data,
                            headers={"Content-Type": "application/json"}) as response:
        check_api_error(path, response.status, await response.json(), status, param)


@pytest.mark.parametrize("path", [MESSAGES, COUNT_TOKENS, RESPONSES])
async def test_mock_status_injects_an_error_in_the_apis_shape(
        engine: MockEngine, session: aiohttp.ClientSession, path: str) -> None:
    body: dict[str, Any] = ({"model": MODEL, "input": "hi"} if path == RESPONSES
                            else _messages_body())
    status, data = await post_json(session, engine, path, {**body, "mock": {"status": 503}})
    assert status == 503
    if path == RESPONSES:
        assert set(data) == {"error"} and data["error"]["type"] == "server_error"
    else:
        assert data["type"] == "error" and data["error"]["type"] == "overloaded_error"
    assert data["error"]["code"] == "mock_injected"


@pytest.mark.parametrize("path", [MESSAGES, RESPONSES])
async def test_die_after_chunks_cuts_the_stream_before_its_end(
        engine: MockEngine, session: aiohttp.ClientSession, path: str) -> None:
    body: dict[str, Any] = ({"model": MODEL, "input": "hi", "max_output_tokens": 4}
                            if path == RESPONSES else _messages_body(max_tokens=4))
    body |= {"stream": True, "mock": {"die_after_chunks": 3}}
    received = b""
    with pytest.raises(aiohttp.ClientPayloadError):
        async with session.post(engine.url + path, json=body) as response:
            async for chunk in response.content.iter_any():
                received += chunk
    assert received.count(b"event: ") > 0
    assert b"message_stop" not in received and b"response.incomplete" not in received
    assert engine.stats.requests_aborted == 1


@pytest.mark.parametrize("path", [MESSAGES, RESPONSES])
async def test_tokens_are_paced_by_the_mock_delays(engine: MockEngine, path: str) -> None:
    """The overhead benchmark streams paced tokens through both APIs."""
    controls = {"mock": {"first_token_delay_ms": 60, "token_delay_ms": 20}}
    started = time.perf_counter()
    if path == MESSAGES:
        stream = await _anthropic(engine).messages.create(
            **_messages_body(max_tokens=4, stream=True), extra_body=controls)
        arrivals = [time.perf_counter() - started async for event in stream
                    if event.type == "content_block_delta"]
    else:
        events = await _openai(engine).responses.create(
            model=MODEL, input="hi", max_output_tokens=4, stream=True, extra_body=controls)
        arrivals = [time.perf_counter() - started async for event in events
                    if event.type == "response.output_text.delta"]
    assert len(arrivals) == 4
    assert arrivals[0] >= 0.055  # the first token after its delay
    assert arrivals[-1] - arrivals[0] >= 3 * 0.018  # then one token per token delay

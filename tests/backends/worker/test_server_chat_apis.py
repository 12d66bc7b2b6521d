"""The worker's Anthropic Messages and OpenAI Responses on the tiny random model, driven by the
official SDKs: the chat path's prompt, greedy text and prefix-cache hits for one conversation,
each API's error shape, and the error event a stream ends with when the engine fails. A real
aiohttp server on loopback, in a thread with its own event loop."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import openai
import orjson
import pytest

from tests.backends.chat_api_checks import (
    API_ERRORS,
    MESSAGES,
    RESPONSES,
    check_api_error,
    check_messages_events,
    check_responses_events,
    message_text,
    with_model,
)
from tests.backends.worker.server_support import MODEL, ServerThread, tiny_engine

pytestmark = pytest.mark.usefixtures("one_torch_thread")
QUESTION = "Which train leaves first?"
STOP_REASONS = {"length": "max_tokens", "stop": "end_turn"}
# Greedy decoding, so every API's answer to one conversation is the same text. (The Anthropic
# SDK in use has no ``temperature`` argument; the Messages API still takes the field.)
GREEDY = {"temperature": 0}


@pytest.fixture(scope="module")
def server() -> Iterator[ServerThread]:
    running = ServerThread(tiny_engine())
    yield running
    running.stop()


def _anthropic(server: ServerThread) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0)


def _openai(server: ServerThread) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def _system() -> str:
    """A system prompt no other request sent: none of its prefix blocks is cached yet."""
    return f"Session {os.urandom(6).hex()}: answer briefly."


def test_one_conversation_has_chats_prompt_text_and_cache_hits_in_every_api(
        server: ServerThread) -> None:
    system = _system()
    chat_client, client = _openai(server), _anthropic(server)
    chat = chat_client.chat.completions.create(
        model=MODEL, max_tokens=6, temperature=0,
        messages=[{"role": "system", "content": system}, {"role": "user", "content": QUESTION}])
    assert chat.usage is not None and chat.usage.prompt_tokens_details is not None
    num_prompt_tokens = chat.usage.prompt_tokens
    assert num_prompt_tokens == len(system + QUESTION)  # the test tokenizer: a token a char
    assert chat.usage.prompt_tokens_details.cached_tokens == 0  # cold
    message = client.messages.create(model=MODEL, max_tokens=6, system=system, extra_body=GREEDY,
                                     messages=[{"role": "user", "content": QUESTION}])
    num_cached_tokens = message.usage.cache_read_input_tokens
    assert num_cached_tokens and num_cached_tokens > num_prompt_tokens // 2  # chat left it
    assert message.usage.input_tokens + num_cached_tokens == num_prompt_tokens
    assert message.usage.output_tokens == chat.usage.completion_tokens
    assert message_text(message) == chat.choices[0].message.content  # greedy: the same text
    assert message.stop_reason == STOP_REASONS[chat.choices[0].finish_reason]
    counted = client.messages.count_tokens(model=MODEL, system=system,
                                           messages=[{"role": "user", "content": QUESTION}])
    assert counted.input_tokens == num_prompt_tokens
    response = chat_client.responses.create(model=MODEL, max_output_tokens=6, temperature=0,
                                            instructions=system, input=QUESTION)
    assert response.usage is not None and response.usage.input_tokens == num_prompt_tokens
    assert response.usage.input_tokens_details.cached_tokens == num_cached_tokens
    assert response.output_text == message_text(message)
    assert response.status == ("incomplete" if chat.choices[0].finish_reason == "length"
                               else "completed")


def test_streams_with_the_sdks_say_what_the_whole_answers_say(server: ServerThread) -> None:
    system = _system()
    client = _anthropic(server)
    body: dict[str, Any] = {"model": MODEL, "max_tokens": 8, "system": system,
                            "messages": [{"role": "user", "content": QUESTION}],
                            "extra_body": GREEDY}
    whole = client.messages.create(**body)
    with client.messages.stream(**body) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == message_text(final) == message_text(whole)
    assert final.usage.output_tokens == whole.usage.output_tokens
    assert final.stop_reason == whole.stop_reason
    check_messages_events([event.type for event in client.messages.create(**body, stream=True)])
    responses = _openai(server)
    events = list(responses.responses.create(model=MODEL, input=QUESTION, instructions=system,
                                             temperature=0, max_output_tokens=8, stream=True))
    final_type = events[-1].type
    assert final_type in ("response.completed", "response.incomplete")
    assert check_responses_events(events, final_type) == message_text(whole)


@pytest.mark.parametrize(("path", "body", "status", "param"), [
    *API_ERRORS,
    pytest.param(MESSAGES, {"max_tokens": 5000, "messages": [{"role": "user", "content": "x"}]},
                 400, "messages", id="messages-longer-than-context"),
    pytest.param(RESPONSES, {"input": "x", "max_output_tokens": 5000}, 400, "input",
                 id="responses-longer-than-context"),
    pytest.param(RESPONSES, {"input": "x", "top_p": 0}, 400, "top_p",
                 id="responses-top-p-zero"),
])
def test_errors_are_in_each_apis_shape(
        server: ServerThread, path: str, body: Any, status: int, param: str | None) -> None:
    body = with_model(body, MODEL)
    response = httpx.post(server.url + path, headers={"Content-Type": "application/json"},
                          content=body if isinstance(body, bytes) else orjson.dumps(body))
    check_api_error(path, response.status_code, response.json(), status, param)


def _fail_the_second_step(server: ServerThread, monkeypatch: pytest.MonkeyPatch) -> None:
    """The engine's next request gets its first token, then a step fails (as CUDA would)."""
    engine = server.engine.engine
    real_step = engine.step
    num_calls = 0

    def step() -> Any:
        nonlocal num_calls
        num_calls += 1
        if num_calls == 2:
            raise RuntimeError("CUDA error: out of memory")
        return real_step()

    monkeypatch.setattr(engine, "step", step)


@pytest.mark.parametrize("path", [MESSAGES, RESPONSES])
def test_an_engine_failure_mid_stream_ends_it_with_the_apis_error_event(
        server: ServerThread, monkeypatch: pytest.MonkeyPatch, path: str) -> None:
    _fail_the_second_step(server, monkeypatch)
    body: dict[str, Any] = {"model": MODEL, "stream": True, "temperature": 0}
    body |= ({"max_tokens": 40, "messages": [{"role": "user", "content": QUESTION}]}
             if path == MESSAGES else {"max_output_tokens": 40, "input": QUESTION})
    response = httpx.post(server.url + path, json=body, timeout=30)
    assert response.status_code == 200
    assert response.headers["Content-Type"] == "text/event-stream"
    events = [event.split("\n") for event in response.text.split("\n\n") if event]
    names = [lines[0].removeprefix("event: ") for lines in events]
    assert names[0] in ("message_start", "response.created")  # the first token went out
    assert names[-1] == "error", names
    error = orjson.loads(events[-1][1].removeprefix("data: "))
    if path == MESSAGES:
        assert error == {"type": "error", "error": {
            "type": "api_error", "message": "The engine failed while generating (CUDA error: "
            "out of memory); retry the request."}}
    else:
        assert error["error"]["type"] == "server_error"
        assert "CUDA error: out of memory" in error["message"]
    # The engine carries on.
    after = _anthropic(server).messages.create(model=MODEL, max_tokens=2,
                                               messages=[{"role": "user", "content": "ok"}])
    assert after.usage.output_tokens >= 1


def test_the_sdks_raise_on_an_error_event(
        server: ServerThread, monkeypatch: pytest.MonkeyPatch) -> None:
    _fail_the_second_step(server, monkeypatch)
    stream = _anthropic(server).messages.stream(
        model=MODEL, max_tokens=40, extra_body=GREEDY,
        messages=[{"role": "user", "content": QUESTION}])
    with pytest.raises(anthropic.APIStatusError, match="out of memory"), stream as events:
        for _ in events:
            pass
    _fail_the_second_step(server, monkeypatch)
    with pytest.raises(openai.APIError, match="out of memory"):
        for _ in _openai(server).responses.create(model=MODEL, input=QUESTION, temperature=0,
                                                  max_output_tokens=40, stream=True):
            pass


def test_the_new_apis_count_in_the_metrics(server: ServerThread) -> None:
    name = "vllm:e2e_request_latency_seconds_count"
    before = server.metrics()[name]
    _anthropic(server).messages.create(model=MODEL, max_tokens=2,
                                       messages=[{"role": "user", "content": "count me"}])
    _openai(server).responses.create(model=MODEL, input="count me", max_output_tokens=2)
    assert server.metrics()[name] == before + 2

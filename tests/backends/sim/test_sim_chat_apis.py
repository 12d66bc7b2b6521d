"""The simulated worker's Anthropic Messages and OpenAI Responses, driven by the official SDKs:
the same prompt tokens and prefix-cache hits as chat for one conversation, counted in the
vLLM metrics, and each API's error shape. A real process on loopback (the real tokenizer)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import openai
import pytest

from gateway.cli.localproc import ProcessGroup
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
from tests.backends.sim.support import MODEL, SimFleet

QUESTION = "Which train leaves first?"


@pytest.fixture(scope="module")
def fleet(procs: ProcessGroup, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimFleet]:
    yield SimFleet(procs, tmp_path_factory.mktemp("sim-apis"), num_workers=1)


def _anthropic(fleet: SimFleet) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=fleet.urls[0], api_key="unused", max_retries=0)


def _openai(fleet: SimFleet) -> openai.OpenAI:
    return openai.OpenAI(base_url=fleet.urls[0] + "/v1", api_key="unused", max_retries=0)


def _system() -> str:
    """A system prompt no other request sent: its first prefix block is cached nowhere yet."""
    return f"Session {os.urandom(6).hex()}. " + "Answer about trains, politely. " * 8


def test_one_conversation_has_chats_prompt_and_cache_hits_in_every_api(
        fleet: SimFleet) -> None:
    system = _system()
    chat_client, client = _openai(fleet), _anthropic(fleet)
    chat = chat_client.chat.completions.create(
        model=MODEL, max_tokens=3, messages=[{"role": "system", "content": system},
                                             {"role": "user", "content": QUESTION}])
    assert chat.usage is not None and chat.usage.prompt_tokens_details is not None
    num_prompt_tokens = chat.usage.prompt_tokens
    assert chat.usage.prompt_tokens_details.cached_tokens == 0  # cold
    message = client.messages.create(model=MODEL, max_tokens=3, system=system,
                                     messages=[{"role": "user", "content": QUESTION}])
    num_cached_tokens = message.usage.cache_read_input_tokens
    assert num_cached_tokens and num_cached_tokens > num_prompt_tokens // 2  # chat left it
    assert message.usage.input_tokens + num_cached_tokens == num_prompt_tokens
    assert message.usage.output_tokens == 3 and message.stop_reason == "max_tokens"
    assert message_text(message) == chat.choices[0].message.content
    counted = client.messages.count_tokens(model=MODEL, system=system,
                                           messages=[{"role": "user", "content": QUESTION}])
    assert counted.input_tokens == num_prompt_tokens
    response = chat_client.responses.create(model=MODEL, max_output_tokens=3,
                                            instructions=system, input=QUESTION)
    assert response.usage is not None and response.usage.input_tokens == num_prompt_tokens
    assert response.usage.input_tokens_details.cached_tokens == num_cached_tokens
    assert response.output_text == message_text(message)
    assert response.status == "incomplete"  # it stopped at max_output_tokens


def test_messages_stream_with_the_anthropic_sdk(fleet: SimFleet) -> None:
    client = _anthropic(fleet)
    body: dict[str, Any] = {"model": MODEL, "max_tokens": 5, "system": _system(),
                            "messages": [{"role": "user", "content": QUESTION}]}
    with client.messages.stream(**body) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text and text == message_text(final)
    assert final.usage.output_tokens == 5 and final.stop_reason == "max_tokens"
    events = list(client.messages.create(**body, stream=True))
    assert check_messages_events([event.type for event in events]) == 5
    assert events[0].type == "message_start" and events[0].message.usage.cache_read_input_tokens
    assert events[-2].type == "message_delta" and events[-2].usage.output_tokens == 5


def test_responses_stream_with_the_openai_sdk(fleet: SimFleet) -> None:
    client = _openai(fleet)
    events = list(client.responses.create(model=MODEL, input=QUESTION, max_output_tokens=4,
                                          stream=True))
    text = check_responses_events(events, "response.incomplete")
    final = events[-1].response  # type: ignore[union-attr]
    assert final.usage is not None and final.incomplete_details is not None
    assert text and final.usage.output_tokens == 4
    assert final.incomplete_details.reason == "max_output_tokens"
    whole = client.responses.create(model=MODEL, input=QUESTION, max_output_tokens=4)
    assert whole.output_text == text
    assert whole.usage is not None and whole.usage.input_tokens == final.usage.input_tokens


def test_the_new_apis_count_in_the_vllm_metrics(fleet: SimFleet) -> None:
    before = fleet.metrics()
    message = _anthropic(fleet).messages.create(
        model=MODEL, max_tokens=2, messages=[{"role": "user", "content": QUESTION}])
    response = _openai(fleet).responses.create(model=MODEL, input=QUESTION, max_output_tokens=3)
    after = fleet.metrics()
    assert response.usage is not None
    num_prompt_tokens = (message.usage.input_tokens + (message.usage.cache_read_input_tokens or 0)
                         + response.usage.input_tokens)
    assert after["vllm:prompt_tokens_total"] - before["vllm:prompt_tokens_total"] \
        == num_prompt_tokens
    assert after["vllm:generation_tokens_total"] - before["vllm:generation_tokens_total"] == 5
    assert after["vllm:request_success_total"] - before["vllm:request_success_total"] == 2


def _post(fleet: SimFleet, path: str, body: Any) -> httpx.Response:
    return httpx.post(fleet.urls[0] + path, headers={"Content-Type": "application/json"},
                      **({"content": body} if isinstance(body, bytes) else {"json": body}))


@pytest.mark.parametrize(("path", "body", "status", "param"), API_ERRORS)
def test_errors_are_in_each_apis_shape(
        fleet: SimFleet, path: str, body: Any, status: int, param: str | None) -> None:
    response = _post(fleet, path, with_model(body, MODEL))
    check_api_error(path, response.status_code, response.json(), status, param)


@pytest.mark.parametrize(("path", "body", "param"), [
    pytest.param(MESSAGES, {"max_tokens": 9000, "messages": [{"role": "user", "content": "x"}]},
                 "messages", id="messages"),
    pytest.param(RESPONSES, {"input": "x", "max_output_tokens": 9000}, "input", id="responses"),
])
def test_the_context_limit_is_refused_in_each_apis_words(
        fleet: SimFleet, path: str, body: dict[str, Any], param: str) -> None:
    response = _post(fleet, path, with_model(body, MODEL))
    check_api_error(path, response.status_code, response.json(), 400, param)
    error = response.json()["error"]
    assert error["code"] == "context_length_exceeded"
    assert f"reduce the length of the {param}" in error["message"], error["message"]


def test_the_sdks_raise_on_each_apis_errors(fleet: SimFleet) -> None:
    with pytest.raises(anthropic.NotFoundError) as not_found:
        _anthropic(fleet).messages.create(model="nope", max_tokens=1,
                                          messages=[{"role": "user", "content": "x"}])
    assert not_found.value.body["error"]["type"] == "not_found_error"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError) as bad:
        _openai(fleet).responses.create(model=MODEL, input="x", previous_response_id="resp_1")
    assert bad.value.code == "unsupported_value"

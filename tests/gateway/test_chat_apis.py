"""Anthropic Messages and OpenAI Responses through a real gateway, with the official SDKs:
simulated engines (the real tokenizer) listed statically, a mock engine for failures, and a
chat-only engine that offers neither API. Auth with x-api-key, quotas, prefix routing over the
rendered system + messages, usage, and each API's own error shapes."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import anthropic
import httpx
import openai
import pytest

from gateway.cli.localproc import (
    ProcessGroup,
    free_port,
    free_port_range,
    python_module_argv,
    wait_http,
)
from tests.fleet import Engine, Gateway, wait_until

SIM = "switchyard-sim"
MOCK = "switchyard-mock"
CHAT_ONLY = "chat-only"
# Long enough to fill several prefix blocks: where it is cached decides the backend.
SYSTEM = " ".join(f"Rule {i}: answer about trains, politely and briefly." for i in range(60))


@pytest.fixture(scope="module")
def gateway(workdir: Path, redis_url: str) -> Iterator[Gateway]:
    with ProcessGroup() as group:
        port = free_port_range(2)
        group.spawn(f"sim-{port}", python_module_argv(
            "backends.sim", "--workers", "2", "--base-port", str(port), "--tokenizer", "real",
            "--model", SIM))
        sims = [f"http://127.0.0.1:{port + i}" for i in range(2)]
        for url in sims:
            wait_http(url + "/health", group=group)
        mock = Engine(group, "apis-mock", models=(MOCK,))
        chat_only_port = free_port()
        group.spawn("chat-only", python_module_argv(
            "tests.faulty_engine", "--port", str(chat_only_port), "--model", CHAT_ONLY))
        wait_http(f"http://127.0.0.1:{chat_only_port}/health", group=group)
        yield Gateway(group, workdir, redis_url, [
            *({"name": f"sim-{i}", "url": url, "models": [SIM]} for i, url in enumerate(sims)),
            mock.backend_config(),
            {"name": "chat-only", "url": f"http://127.0.0.1:{chat_only_port}",
             "models": [CHAT_ONLY]}],
            routing={"discover_workers": False, "expose_backend_header": True,
                     "tokenizers": {SIM: "real", CHAT_ONLY: "real"}},
            usage={"flush_interval_s": 0.2})


def _anthropic(gateway: Gateway, key: str | None = None) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=gateway.url, api_key=key or gateway.new_key(),
                               max_retries=0)


def _openai(gateway: Gateway, key: str | None = None) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.url + "/v1", api_key=key or gateway.new_key(),
                         max_retries=0)


def test_the_anthropic_sdk_creates_a_message(gateway: Gateway) -> None:
    client = _anthropic(gateway)
    raw = client.messages.with_raw_response.create(
        model=SIM, max_tokens=5, system="Be brief.",
        messages=[{"role": "user", "content": "Tell me about trains."}])
    assert raw.headers["x-switchyard-model"] == SIM
    message = raw.parse()
    assert message.role == "assistant" and message.content[0].type == "text"
    assert message.content[0].text.strip()
    assert message.usage.output_tokens == 5 and message.stop_reason == "max_tokens"
    counted = client.messages.count_tokens(
        model=SIM, system="Be brief.", messages=[{"role": "user", "content":
                                                  "Tell me about trains."}])
    usage = message.usage
    assert counted.input_tokens == usage.input_tokens + (usage.cache_read_input_tokens or 0)


def test_the_anthropic_sdk_streams_a_message(gateway: Gateway) -> None:
    client = _anthropic(gateway)
    with client.messages.stream(model=SIM, max_tokens=7,
                                messages=[{"role": "user", "content": "Stream, please."}]
                                ) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text and text == final.content[0].text  # type: ignore[union-attr]
    assert final.usage.output_tokens == 7 and final.stop_reason == "max_tokens"


def test_the_async_anthropic_sdk_sees_every_event_in_order(gateway: Gateway) -> None:
    async def run() -> list[str]:
        client = anthropic.AsyncAnthropic(base_url=gateway.url, api_key=gateway.new_key(),
                                          max_retries=0)
        stream = await client.messages.create(
            model=SIM, max_tokens=3, stream=True,
            messages=[{"role": "user", "content": "Three tokens."}])
        types = [event.type async for event in stream]
        await client.close()
        return types

    types = asyncio.run(run())
    assert types[:2] == ["message_start", "content_block_start"]
    assert types[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert types.count("content_block_delta") == 3


def test_one_conversation_through_three_apis_renders_the_same_prompt_and_routes_to_its_cache(
        gateway: Gateway) -> None:
    """The Messages body is routed on its rendered system + messages: the chat and Responses
    forms of the same conversation find the backend that cached it, and every API reports
    the same prompt."""
    key = gateway.new_key()
    question = "Which train leaves first?"
    raw = _anthropic(gateway, key).messages.with_raw_response.create(
        model=SIM, max_tokens=2, system=SYSTEM,
        messages=[{"role": "user", "content": question}])
    backend = raw.headers["x-switchyard-backend"]
    message = raw.parse()
    num_prompt_tokens = message.usage.input_tokens + (message.usage.cache_read_input_tokens or 0)

    client = _openai(gateway, key)
    chat = client.chat.completions.with_raw_response.create(
        model=SIM, max_tokens=2, messages=[{"role": "system", "content": SYSTEM},
                                           {"role": "user", "content": question}])
    assert chat.headers["x-switchyard-backend"] == backend
    usage = chat.parse().usage
    assert usage is not None and usage.prompt_tokens == num_prompt_tokens
    assert usage.prompt_tokens_details is not None
    assert usage.prompt_tokens_details.cached_tokens  # the Messages request left it there

    response = client.responses.with_raw_response.create(
        model=SIM, max_output_tokens=2, instructions=SYSTEM, input=question)
    assert response.headers["x-switchyard-backend"] == backend
    result = response.parse()
    assert result.usage is not None and result.usage.input_tokens == num_prompt_tokens
    assert result.usage.input_tokens_details.cached_tokens > 0


def test_the_openai_sdk_creates_and_streams_responses(gateway: Gateway) -> None:
    client = _openai(gateway)
    response = client.responses.create(model=SIM, input="Tell me about trains.",
                                       max_output_tokens=4)
    assert response.output_text.strip() and response.usage is not None
    assert response.usage.output_tokens == 4
    assert response.status == "incomplete"  # it stopped at max_output_tokens
    events = list(client.responses.create(model=SIM, input="Stream it.", max_output_tokens=3,
                                          stream=True))
    types = [event.type for event in events]
    assert types[0] == "response.created" and types[-1] == "response.incomplete"
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    final = events[-1].response  # type: ignore[union-attr]
    assert deltas and deltas == final.output_text
    assert [e.sequence_number for e in events] == list(range(len(events)))


def test_x_api_key_and_bearer_both_authenticate(gateway: Gateway) -> None:
    key = gateway.new_key()
    body = {"model": SIM, "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]}
    for headers in ({"x-api-key": key}, {"Authorization": f"Bearer {key}"}):
        response = httpx.post(gateway.url + "/v1/messages", json=body, headers=headers,
                              timeout=10)
        assert response.status_code == 200, response.text
    chat = httpx.post(gateway.url + "/v1/chat/completions", headers={"x-api-key": key},
                      json={"model": SIM, "max_tokens": 1,
                            "messages": [{"role": "user", "content": "hi"}]}, timeout=10)
    assert chat.status_code == 200, chat.text


@pytest.mark.parametrize(("body", "headers", "status", "kind", "code"), [
    pytest.param({"model": SIM, "messages": [{"role": "user", "content": "x"}]}, None, 400,
                 "invalid_request_error", "invalid_request", id="no-max-tokens"),
    pytest.param({"model": SIM, "max_tokens": 1, "messages": [{"role": "system",
                                                               "content": "x"}]},
                 None, 400, "invalid_request_error", "invalid_request", id="system-role"),
    pytest.param({"model": "nope", "max_tokens": 1, "messages": [{"role": "user",
                                                                  "content": "x"}]},
                 None, 404, "not_found_error", "model_not_found", id="unknown-model"),
    pytest.param({"model": CHAT_ONLY, "max_tokens": 1,
                  "messages": [{"role": "user", "content": "x"}]},
                 None, 404, "not_found_error", "unsupported_endpoint", id="chat-only-engine"),
    pytest.param({"model": SIM, "max_tokens": 100_000,
                  "messages": [{"role": "user", "content": "x"}]},
                 None, 400, "invalid_request_error", "context_length_exceeded",
                 id="engine-refuses"),
    pytest.param({"model": SIM, "max_tokens": 1, "messages": [{"role": "user",
                                                               "content": "x"}]},
                 {"x-api-key": "sy-wrong"}, 401, "authentication_error", "invalid_api_key",
                 id="bad-key"),
    pytest.param({"model": SIM, "max_tokens": 1, "messages": [{"role": "user",
                                                               "content": "x"}]},
                 {}, 401, "authentication_error", "missing_api_key", id="no-key"),
])
def test_messages_errors_are_anthropics_shape(
        gateway: Gateway, body: dict[str, object], headers: dict[str, str] | None, status: int,
        kind: str, code: str) -> None:
    sent = {"x-api-key": gateway.new_key()} if headers is None else headers
    response = httpx.post(gateway.url + "/v1/messages", json=body, headers=sent, timeout=10)
    assert response.status_code == status, response.text
    data = response.json()
    assert data["type"] == "error", data
    assert data["error"]["type"] == kind and data["error"]["message"]
    if code != "context_length_exceeded":  # the engine's own error names no code here
        assert data["error"]["code"] == code


def test_the_sdks_raise_on_each_apis_errors(gateway: Gateway) -> None:
    with pytest.raises(anthropic.NotFoundError) as not_found:
        _anthropic(gateway).messages.create(model="nope", max_tokens=1,
                                            messages=[{"role": "user", "content": "x"}])
    assert not_found.value.body["error"]["type"] == "not_found_error"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError) as bad:
        _openai(gateway).responses.create(model=SIM, input=[{"role": "robot",
                                                             "content": "x"}])  # type: ignore
    assert bad.value.body["param"] == "input[0].role"  # type: ignore[index]


def test_a_tenant_at_its_request_quota_gets_anthropics_429(gateway: Gateway) -> None:
    client = _anthropic(gateway, gateway.new_key(limits={"requests_per_minute": 1}))
    messages = [{"role": "user", "content": "x"}]
    client.messages.create(model=SIM, max_tokens=1, messages=messages)  # type: ignore[arg-type]
    with pytest.raises(anthropic.RateLimitError) as limited:
        client.messages.create(model=SIM, max_tokens=1, messages=messages)  # type: ignore
    assert limited.value.response.headers["retry-after"]
    assert limited.value.body["error"]["type"] == "rate_limit_error"  # type: ignore[index]


def test_a_stream_the_engine_breaks_off_raises_in_both_sdks(gateway: Gateway) -> None:
    broken = {"mock": {"die_after_chunks": 4}}
    with (pytest.raises(anthropic.APIStatusError) as messages_error,
          _anthropic(gateway).messages.stream(
              model=MOCK, max_tokens=8, messages=[{"role": "user", "content": "x"}],
              extra_body=broken) as stream):
        for _ in stream:
            pass
    assert "broke off" in str(messages_error.value)
    with pytest.raises(openai.APIError) as responses_error:
        for _ in _openai(gateway).responses.create(model=MOCK, input="x", max_output_tokens=8,
                                                   stream=True, extra_body=broken):
            pass
    assert "broke off" in str(responses_error.value)


def test_the_routes_are_timed_and_counted_apart(gateway: Gateway) -> None:
    client = _anthropic(gateway)
    client.messages.create(model=SIM, max_tokens=1, messages=[{"role": "user", "content": "x"}])
    _openai(gateway).responses.create(model=SIM, input="x", max_output_tokens=1)
    metrics = httpx.get(gateway.url + "/metrics", timeout=10).text
    for route in ("messages", "responses"):
        assert f'route="{route}"' in metrics, route


def test_usage_is_charged_as_each_api_reported_it(gateway: Gateway) -> None:
    """Anthropic's input_tokens leave the cache reads out; Responses' hold them: the tenant
    is charged the engine's whole prompt, cached and output tokens, streamed or not."""
    tenant = gateway.create_tenant()
    key = gateway.create_key(tenant["id"])
    claude, client = _anthropic(gateway, key), _openai(gateway, key)
    prompt = cached = output = 0
    for index in range(4):  # the same system prompt: later ones hit the cache
        turn = [{"role": "user", "content": f"Question {index} about trains?"}]
        if index % 2:
            with claude.messages.stream(model=SIM, max_tokens=3, system=SYSTEM,
                                        messages=turn) as stream:  # type: ignore[arg-type]
                usage = stream.get_final_message().usage
        else:
            usage = claude.messages.create(model=SIM, max_tokens=3, system=SYSTEM,
                                           messages=turn).usage  # type: ignore[arg-type]
        prompt += usage.input_tokens + (usage.cache_read_input_tokens or 0)
        cached += usage.cache_read_input_tokens or 0
        output += usage.output_tokens
        if index % 2:
            events = list(client.responses.create(model=SIM, instructions=SYSTEM, stream=True,
                                                  input=turn[0]["content"],
                                                  max_output_tokens=2))
            reported = events[-1].response.usage  # type: ignore[union-attr]
        else:
            reported = client.responses.create(model=SIM, instructions=SYSTEM,
                                               input=turn[0]["content"],
                                               max_output_tokens=2).usage
        assert reported is not None
        prompt += reported.input_tokens
        cached += reported.input_tokens_details.cached_tokens
        output += reported.output_tokens
    assert cached > 0

    def total() -> dict[str, int]:
        response = gateway.admin.get("/admin/usage", params={"tenant": tenant["id"]})
        assert response.status_code == 200, response.text
        return dict(response.json()["total"])

    assert wait_until(lambda: total()["requests"] == 8, timeout_s=5)
    found = total()
    assert (found["prompt_tokens"], found["cached_tokens"], found["output_tokens"]) == (
        prompt, cached, output)


def test_count_tokens_for_an_engine_without_it_is_answered_by_the_gateway(
        gateway: Gateway) -> None:
    """The chat-only engine has no /v1/messages/count_tokens; the gateway has the model's
    tokenizer (routing.tokenizers), so it counts the rendered prompt itself, as the simulated
    engine (the same tokenizer and template) counts it."""
    client = _anthropic(gateway)
    turns = [{"role": "user", "content": "How many tokens is this?"}]
    raw = client.messages.with_raw_response.count_tokens(model=CHAT_ONLY, system="Be brief.",
                                                         messages=turns)  # type: ignore
    assert raw.headers["x-switchyard-counted-by"] == "gateway"
    by_engine = client.messages.count_tokens(model=SIM, system="Be brief.",
                                             messages=turns)  # type: ignore[arg-type]
    assert raw.parse().input_tokens == by_engine.input_tokens > 0

"""The gateway through the official `openai` SDK: results, usage, pass-through and errors.

Every test talks to real processes on loopback: redis-server, mock engines and `switchyard serve`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import httpx
import openai
import pytest

from gateway.cli.localproc import ProcessGroup, free_port, wait_http
from tests.fleet import MODEL, Engine, Gateway, process_group

PROMPT = "alpha beta gamma"
MAX_TOKENS = 5
# The mock engine repeats the words of the prompt, one word per token.
EXPECTED_TEXT = " alpha beta gamma alpha beta"
ERROR_FIELDS = {"message", "type", "param", "code"}


class AliveGateway(Gateway):
    """A Gateway that waits for /healthz instead of /readyz: for a fleet with no healthy backend.

    Example::

        AliveGateway(procs, workdir, redis_url, [{"name": "gone", "url": url, "models": [MODEL]}])
    """

    def __init__(self, group: ProcessGroup, workdir: Path, redis_url: str,
                 backends: list[dict[str, Any]], **overrides: Any) -> None:
        def wait_alive(url: str, **kwargs: Any) -> None:
            wait_http(url.removesuffix("/readyz") + "/healthz", **kwargs)

        with mock.patch("tests.fleet.wait_http", wait_alive):
            super().__init__(group, workdir, redis_url, backends, **overrides)


def sync_client(gateway: Gateway, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.url + "/v1", api_key=key, max_retries=0, timeout=20)


def async_client(gateway: Gateway, key: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=gateway.url + "/v1", api_key=key, max_retries=0, timeout=20)


def request_args(endpoint: str, model: str = MODEL, **fields: Any) -> dict[str, Any]:
    """Arguments of a chat or text completion asking for MAX_TOKENS tokens of PROMPT."""
    args: dict[str, Any] = {"model": model, "max_tokens": MAX_TOKENS, **fields}
    if endpoint == "chat":
        args["messages"] = [{"role": "user", "content": PROMPT}]
    else:
        args["prompt"] = PROMPT
    return args


async def create(client_kind: str, gateway: Gateway, key: str, endpoint: str,
                 **args: Any) -> Any:
    """One create() call with OpenAI or AsyncOpenAI; a stream comes back as a list of chunks."""
    if client_kind == "sync":
        with sync_client(gateway, key) as client:
            api: Any = client.chat.completions if endpoint == "chat" else client.completions
            result = api.create(**args)
            return list(result) if args.get("stream") else result
    async with async_client(gateway, key) as aclient:
        api = aclient.chat.completions if endpoint == "chat" else aclient.completions
        result = await api.create(**args)
        return [chunk async for chunk in result] if args.get("stream") else result


def text_of(endpoint: str, choice: Any) -> str:
    if endpoint == "chat":
        return str(choice.message.content)
    return str(choice.text)


def delta_text(endpoint: str, choice: Any) -> str:
    if endpoint == "chat":
        return choice.delta.content or ""
    return str(choice.text)


def counter_value(gateway: Gateway, name: str) -> float:
    """The sum of a counter's series in the gateway's /metrics."""
    text = httpx.get(gateway.url + "/metrics", timeout=5).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith((name + " ", name + "{"))
    )


CLIENTS = [pytest.param("sync", id="OpenAI"), pytest.param("async", id="AsyncOpenAI")]
ENDPOINTS = [pytest.param("chat", id="chat"), pytest.param("completions", id="completions")]
STREAM_MODES = [pytest.param(False, id="whole"), pytest.param(True, id="stream")]


# -- results and usage ------------------------------------------------------------------------


@pytest.mark.parametrize("client_kind", CLIENTS)
@pytest.mark.parametrize("endpoint", ENDPOINTS)
async def test_whole_response_has_text_and_usage(
    gateway: Gateway, api_key: str, client_kind: str, endpoint: str
) -> None:
    result = await create(client_kind, gateway, api_key, endpoint, **request_args(endpoint))

    assert len(result.choices) == 1
    assert text_of(endpoint, result.choices[0]) == EXPECTED_TEXT
    assert result.choices[0].finish_reason == "length"
    assert result.model == MODEL
    assert (result.usage.prompt_tokens, result.usage.completion_tokens) == (3, MAX_TOKENS)
    assert result.usage.total_tokens == 3 + MAX_TOKENS


@pytest.mark.parametrize("client_kind", CLIENTS)
@pytest.mark.parametrize("endpoint", ENDPOINTS)
@pytest.mark.parametrize("include_usage", [
    pytest.param(False, id="no-usage"),
    pytest.param(True, id="include-usage"),
])
async def test_stream_has_text_and_usage_only_when_asked(
    gateway: Gateway, api_key: str, client_kind: str, endpoint: str, include_usage: bool
) -> None:
    args = request_args(endpoint, stream=True)
    if include_usage:
        args["stream_options"] = {"include_usage": True}

    chunks = await create(client_kind, gateway, api_key, endpoint, **args)

    body, tail = (chunks[:-1], chunks[-1]) if include_usage else (chunks, None)
    assert all(chunk.choices and chunk.usage is None for chunk in body)
    assert "".join(delta_text(endpoint, c.choices[0]) for c in body) == EXPECTED_TEXT
    assert body[-1].choices[0].finish_reason == "length"
    if tail is not None:
        assert tail.choices == []
        assert (tail.usage.prompt_tokens, tail.usage.completion_tokens) == (3, MAX_TOKENS)


# -- pass-through: fields, request ids, models -----------------------------------------------


@pytest.mark.parametrize("endpoint", ENDPOINTS)
@pytest.mark.parametrize("stream", STREAM_MODES)
def test_unknown_fields_reach_the_engine_untouched(
    gateway: Gateway, engines: list[Engine], api_key: str, endpoint: str, stream: bool
) -> None:
    extra = {
        "vendor_option": {"nested": [1, 2.5, None, "ü"], "flag": True},
        "guided_choice": ["yes", "no"],
        "chat_template_kwargs": {"enable_thinking": False},
    }
    args = request_args(endpoint, model="model-a", stream=stream)  # model-a: engine-a only
    with sync_client(gateway, api_key) as client:
        api: Any = client.chat.completions if endpoint == "chat" else client.completions
        result = api.create(**args, extra_body=extra)
        if stream:
            list(result)

    assert engines[0].stats()["last_body"] == {**args, **extra}


@pytest.mark.parametrize("stream", STREAM_MODES)
@pytest.mark.parametrize("sent_id", [
    pytest.param("client-id-0123:abc/def", id="client-sent"),
    pytest.param(None, id="generated"),
])
def test_request_id_comes_back_and_reaches_the_engine(
    gateway: Gateway, engines: list[Engine], api_key: str, stream: bool, sent_id: str | None
) -> None:
    headers = {"x-request-id": sent_id} if sent_id else {}
    with sync_client(gateway, api_key) as client:
        raw = client.chat.completions.with_raw_response.create(
            **request_args("chat", model="model-a", stream=stream), extra_headers=headers
        )
        returned_id = raw.headers["x-request-id"]
        parsed = raw.parse()
        if stream:
            list(parsed)

    if sent_id:
        assert returned_id == sent_id
    else:
        assert returned_id.startswith("req-") and len(returned_id) > 10
    assert engines[0].stats()["last_headers"]["x-request-id"] == returned_id


def test_generated_request_ids_differ(gateway: Gateway, api_key: str) -> None:
    with sync_client(gateway, api_key) as client:
        ids = {
            client.chat.completions.with_raw_response.create(**request_args("chat"))
            .headers["x-request-id"]
            for _ in range(3)
        }
    assert len(ids) == 3


@pytest.mark.parametrize("client_kind", CLIENTS)
@pytest.mark.parametrize(("allowed", "expected"), [
    pytest.param(None, {MODEL, "model-a", "model-b"}, id="all-models"),
    pytest.param(["model-a"], {"model-a"}, id="allowlist"),
])
async def test_models_list(
    gateway: Gateway, client_kind: str, allowed: list[str] | None, expected: set[str]
) -> None:
    key = gateway.new_key(models=allowed)
    if client_kind == "sync":
        with sync_client(gateway, key) as client:
            models = list(client.models.list())
    else:
        async with async_client(gateway, key) as aclient:
            models = [m async for m in aclient.models.list()]

    assert {m.id for m in models} == expected
    assert all(m.object == "model" for m in models)


# -- error mapping ----------------------------------------------------------------------------


UNKNOWN_KEY = "sy-0123456789abcdef-" + "A" * 43


@pytest.mark.parametrize("client_kind", CLIENTS)
@pytest.mark.parametrize(("case", "error_class", "status", "code"), [
    pytest.param("invalid-field", openai.BadRequestError, 400, "invalid_value", id="400"),
    pytest.param("unknown-key", openai.AuthenticationError, 401, "invalid_api_key", id="401"),
    pytest.param("not-allowed", openai.PermissionDeniedError, 403, "model_not_allowed", id="403"),
    pytest.param("unknown-model", openai.NotFoundError, 404, "model_not_found", id="404"),
    pytest.param("engine-429", openai.RateLimitError, 429, "mock_injected", id="429"),
    pytest.param("engine-400", openai.BadRequestError, 400, None, id="400-from-engine"),
])
async def test_errors_map_to_sdk_exceptions(
    gateway: Gateway, api_key: str, client_kind: str, case: str,
    error_class: type[openai.APIStatusError], status: int, code: str | None,
) -> None:
    key = api_key
    args = request_args("chat")
    if case == "invalid-field":
        args["temperature"] = 5
    elif case == "unknown-key":
        key = UNKNOWN_KEY
    elif case == "not-allowed":
        key = gateway.new_key(models=["model-a"])
        args["model"] = "model-b"
    elif case == "unknown-model":
        args["model"] = "no-such-model"
    elif case == "engine-429":
        args["extra_body"] = {"mock": {"status": 429}}
    elif case == "engine-400":
        args["extra_body"] = {"mock": {"token_delay_ms": "slow"}}  # only the engine checks it

    with pytest.raises(error_class) as caught:
        await create(client_kind, gateway, key, "chat", **args)

    assert caught.value.status_code == status
    assert caught.value.response.headers["content-type"].startswith("application/json")
    body = caught.value.body
    assert isinstance(body, dict) and set(body) == ERROR_FIELDS
    assert body["message"]
    if code is not None:
        assert body["code"] == code


@pytest.mark.parametrize("client_kind", CLIENTS)
@pytest.mark.parametrize("stream", STREAM_MODES)
async def test_502_when_both_backends_break_after_one_retry(
    gateway: Gateway, engines: list[Engine], api_key: str, client_kind: str, stream: bool
) -> None:
    aborted_before = [e.stats()["requests_aborted"] for e in engines]
    args = request_args("chat", stream=stream, extra_body={"mock": {"die_after_chunks": 0}})

    with pytest.raises(openai.InternalServerError) as caught:
        await create(client_kind, gateway, api_key, "chat", **args)

    assert caught.value.status_code == 502
    assert caught.value.body["code"] == "upstream_failed"
    aborted_after = [e.stats()["requests_aborted"] for e in engines]
    assert [a - b for a, b in zip(aborted_after, aborted_before, strict=True)] == [1, 1]
    # Aborted responses do not take a backend out: the next request is served.
    assert (await create(client_kind, gateway, api_key, "chat", **request_args("chat"))).choices


@pytest.fixture(scope="module")
def module_group() -> Iterator[ProcessGroup]:
    """This module's own gateways: a child another module stopped in `procs` cannot fail them."""
    with process_group() as group:
        yield group


@pytest.fixture(scope="module")
def dead_backend_gateway(module_group: ProcessGroup, workdir: Path, redis_url: str) -> Gateway:
    closed = {"name": "closed-port", "url": f"http://127.0.0.1:{free_port()}", "models": [MODEL]}
    return AliveGateway(module_group, workdir, redis_url, [closed])


@pytest.mark.parametrize("stream", STREAM_MODES)
def test_503_when_no_backend_is_healthy(
    dead_backend_gateway: Gateway, api_key: str, stream: bool
) -> None:
    with sync_client(dead_backend_gateway, api_key) as client, \
            pytest.raises(openai.InternalServerError) as caught:
        client.chat.completions.create(**request_args("chat", stream=stream))

    assert caught.value.status_code == 503
    assert caught.value.body["code"] == "no_healthy_backend"
    assert int(caught.value.response.headers["retry-after"]) >= 1
    readyz = httpx.get(dead_backend_gateway.url + "/readyz", timeout=5)
    assert readyz.status_code == 503 and "no healthy backend" in readyz.json()["error"]["message"]


@pytest.fixture(scope="module")
def impatient_gateway(module_group: ProcessGroup, workdir: Path, redis_url: str,
                      engines: list[Engine]) -> Gateway:
    return Gateway(module_group, workdir, redis_url, [e.backend_config() for e in engines],
                   upstream={"first_byte_timeout_s": 0.4, "request_timeout_s": 0.4})


@pytest.mark.parametrize("client_kind", CLIENTS)
@pytest.mark.parametrize("stream", STREAM_MODES)
async def test_504_when_the_engine_hangs(
    impatient_gateway: Gateway, api_key: str, client_kind: str, stream: bool
) -> None:
    args = request_args("chat", model="model-a", stream=stream,
                        extra_body={"mock": {"hang_ms": 1500}})

    with pytest.raises(openai.InternalServerError) as caught:
        await create(client_kind, impatient_gateway, api_key, "chat", **args)

    assert caught.value.status_code == 504
    assert caught.value.body["code"] == "upstream_timeout"


@pytest.mark.parametrize(("make_request", "status", "code"), [
    pytest.param("sdk", 413, "request_too_large", id="413-sdk-content-length"),
    pytest.param("chunked", 413, "request_too_large", id="413-chunked-body"),
    pytest.param("text-plain", 415, "unsupported_media_type", id="415-text-plain"),
])
def test_body_errors_leave_the_gateway_serving(
    gateway: Gateway, api_key: str, make_request: str, status: int, code: str
) -> None:
    huge = "x" * (9 * 1024 * 1024)
    url = gateway.url + "/v1/chat/completions"
    headers = {"Authorization": f"Bearer {api_key}"}
    if make_request == "sdk":
        with sync_client(gateway, api_key) as client, \
                pytest.raises(openai.APIStatusError) as caught:
            client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": huge}]
            )
        response: Any = caught.value.response
    elif make_request == "chunked":
        def chunks() -> Iterator[bytes]:
            yield b'{"model": "switchyard-mock", "messages": [{"role": "user", "content": "'
            for _ in range(9):
                yield b"x" * (1024 * 1024)
            yield b'"}]}'

        response = httpx.post(url, content=chunks(), timeout=20,
                              headers={**headers, "Content-Type": "application/json"})
    else:
        response = httpx.post(url, content=b"hello", timeout=20,
                              headers={**headers, "Content-Type": "text/plain"})

    assert response.status_code == status
    error = response.json()["error"]
    assert set(error) == ERROR_FIELDS and error["code"] == code
    with sync_client(gateway, api_key) as client:
        assert client.chat.completions.create(**request_args("chat")).choices


# -- a backend dies ---------------------------------------------------------------------------


@pytest.fixture
def own_group() -> Iterator[ProcessGroup]:
    """Processes this test may kill without upsetting any other group's startup checks."""
    with process_group() as group:
        yield group


async def test_killed_engine_requests_retry_on_the_other(
    own_group: ProcessGroup, workdir: Path, redis_url: str, api_key: str
) -> None:
    doomed, survivor = Engine(own_group, "doomed"), Engine(own_group, "survivor")
    # Slow health checks: only the request path can notice the dead engine.
    gateway = Gateway(own_group, workdir, redis_url,
                      [doomed.backend_config(), survivor.backend_config()],
                      upstream={"health_interval_s": 60})
    async with async_client(gateway, api_key) as aclient:
        warm = [aclient.chat.completions.create(**request_args("chat")) for _ in range(6)]
        await asyncio.gather(*warm)  # pooled keep-alive connections to both engines
        assert doomed.stats()["requests_completed"] > 0
        survivor.reset()

        doomed.process.kill()
        doomed.process.wait()

        async def one(index: int) -> str:
            is_stream = index % 2 == 1
            result = await aclient.chat.completions.create(
                **request_args("chat", stream=is_stream)
            )
            if not is_stream:
                return str(result.choices[0].message.content)
            return "".join([c.choices[0].delta.content or "" async for c in result])

        texts = await asyncio.gather(*(one(i) for i in range(10)))

    assert texts == [EXPECTED_TEXT] * 10
    assert survivor.stats()["requests_completed"] == 10
    assert counter_value(gateway, "switchyard_upstream_retries_total") >= 1

"""The engines' common wire format (`backends.engine_http`), on hand-made values; every engine's
own tests (sim, worker, mock) check it end to end through the official SDK."""

from __future__ import annotations

from dataclasses import dataclass

import orjson
import pytest
from aiohttp import web

from backends import engine_http
from backends.mock.config import MockEngineConfig
from backends.mock.server import create_app as mock_app


@dataclass(frozen=True)
class Req:
    is_chat: bool
    model: str = "m"


@pytest.mark.parametrize(("status", "kind"), [
    (400, "invalid_request_error"), (401, "authentication_error"), (403, "permission_error"),
    (404, "invalid_request_error"), (409, "conflict"), (429, "rate_limit_error"),
    (500, "server_error"), (503, "server_error"),
])
def test_error_bodies_are_openai_errors(status: int, kind: str) -> None:
    response = engine_http.error_response(status, "Change this.", "model", "model_not_found")
    assert response.status == status
    assert response.content_type == "application/json"
    assert isinstance(response.body, bytes)
    assert orjson.loads(response.body) == {"error": {
        "message": "Change this.", "type": kind, "param": "model", "code": "model_not_found"}}


@pytest.mark.parametrize("is_chat", [True, False])
def test_completion_and_chunk_shapes(is_chat: bool) -> None:
    completion_id = engine_http.new_completion_id(is_chat)
    assert completion_id.startswith("chatcmpl-" if is_chat else "cmpl-")
    usage = {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
    body = orjson.loads(engine_http.completion_body(Req(is_chat), completion_id, "hi", usage,
                                                    created_s=7, finish_reason="stop"))
    choice = {"index": 0, "logprobs": None, "finish_reason": "stop"} | (
        {"message": {"role": "assistant", "content": "hi"}} if is_chat else {"text": "hi"})
    assert body == {"id": completion_id,
                    "object": "chat.completion" if is_chat else "text_completion",
                    "created": 7, "model": "m", "choices": [choice], "usage": usage}
    head = engine_http.stream_head(Req(is_chat), completion_id, created_s=7)
    assert head["object"] == ("chat.completion.chunk" if is_chat else "text_completion")
    event = engine_http.sse_event({**head, "choices": []})
    assert event.startswith(b"data: {") and event.endswith(b"}\n\n")
    assert orjson.loads(event[len(b"data: "):]) == {**head, "choices": []}


def test_models_page_names_each_model_and_its_context() -> None:
    page = engine_http.models_page(["a", "b"], max_model_len=4096)
    assert [m["id"] for m in page["data"]] == ["a", "b"]
    assert all(m["max_model_len"] == 4096 and m["root"] == m["id"] for m in page["data"])
    assert "max_model_len" not in engine_http.models_page(["a"])["data"][0]


def test_an_engine_app_serves_the_common_routes() -> None:
    app = mock_app(MockEngineConfig(models=("m",)))
    routes = {(r.method, r.resource.canonical) for r in app.router.routes()
              if r.resource is not None}
    common = web.Application()

    async def serve(request: web.Request, is_chat: bool) -> web.StreamResponse:
        raise AssertionError("not called")

    async def serve_api(request: web.Request, name: str) -> web.StreamResponse:
        raise AssertionError("not called")

    async def page(request: web.Request) -> web.StreamResponse:
        raise AssertionError("not called")

    engine_http.add_openai_routes(common, serve, models=page, health=page, metrics=page)
    engine_http.add_chat_api_routes(common, serve_api)
    expected = {(r.method, r.resource.canonical) for r in common.router.routes()
                if r.resource is not None and r.method != "HEAD"}
    assert expected == {("POST", "/v1/chat/completions"), ("POST", "/v1/completions"),
                        ("GET", "/v1/models"), ("GET", "/health"), ("GET", "/metrics"),
                        ("POST", "/v1/messages"), ("POST", "/v1/messages/count_tokens"),
                        ("POST", "/v1/responses")}
    assert expected <= routes


"""The engines' reading of Messages, count_tokens and Responses requests (`backends.api_http`),
on hand-made bodies: what is refused before the engine, in which API's shape. Every engine's
own tests check the answers end to end through the official SDKs."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from backends.api_http import ApiCallRefused, api_call, api_error_response
from backends.api_wire import MessagesWire, ResponsesWire
from backends.engine_http import ChatApiName

USER = [{"role": "user", "content": "hi"}]


def _refusal(name: ChatApiName, body: Any) -> tuple[int, dict[str, Any]]:
    with pytest.raises(ApiCallRefused) as refused:
        api_call(name, body)
    response = refused.value.response
    assert response.content_type == "application/json"
    assert isinstance(response.body, bytes)
    return response.status, orjson.loads(response.body)


@pytest.mark.parametrize(("name", "body", "param", "code"), [
    pytest.param("messages", [1], None, "invalid_json", id="messages-not-an-object"),
    pytest.param("messages", {"model": "m", "messages": USER}, "max_tokens", "invalid_request",
                 id="messages-no-max-tokens"),
    pytest.param("messages", {"model": "m", "max_tokens": 4, "messages": [
        {"role": "user", "content": [{"type": "document", "source": {}}]}]}, "document",
        "unsupported_content", id="messages-document"),
    pytest.param("count_tokens", {"model": "m", "messages": [{"role": "user", "content": [
        {"type": "image", "source": {}}]}]}, "image", "unsupported_content",
        id="count-image"),
    pytest.param("count_tokens", {"model": "m", "max_tokens": 0, "messages": USER},
                 "max_tokens", "invalid_value", id="count-max-tokens-zero"),
    pytest.param("responses", {"model": "m", "previous_response_id": "resp_1"},
                 "previous_response_id", "unsupported_value",
                 id="responses-previous-response-id-without-input"),
    pytest.param("responses", {"model": "m", "input": [{"type": "input_file", "file_id": "f"}]},
                 "input_file", "unsupported_content", id="responses-file"),
    pytest.param("responses", {"model": "m", "input": [{"type": "reasoning", "summary": []}]},
                 "input", "invalid_value", id="responses-nothing-to-answer"),
])
def test_refused_before_the_engine_in_the_apis_shape(
        name: ChatApiName, body: Any, param: str | None, code: str) -> None:
    status, data = _refusal(name, body)
    assert status == 400
    if name == "responses":
        assert set(data) == {"error"}
    else:
        assert data["type"] == "error"
    error = data["error"]
    assert (error["type"], error["param"], error["code"]) == ("invalid_request_error", param,
                                                              code)
    assert error["message"]


def test_the_refusals_say_what_to_send_instead() -> None:
    _, image = _refusal("messages", {"model": "m", "max_tokens": 4, "messages": [
        {"role": "user", "content": [{"type": "image", "source": {}}]}]})
    assert "reads text only" in image["error"]["message"]
    _, previous = _refusal("responses", {"model": "m", "input": "hi",
                                         "previous_response_id": "resp_1"})
    assert "send the whole conversation in 'input'" in previous["error"]["message"]


def test_a_call_is_the_chat_request_it_renders_to() -> None:
    messages = api_call("messages", {"model": "m", "max_tokens": 8, "system": "Be brief.",
                                     "messages": [{"role": "user", "content": [
                                         {"type": "thinking", "thinking": "hmm"},
                                         {"type": "text", "text": "Hi"}]}],
                                     "metadata": {"user_id": "u1"}})
    assert messages.chat_body() == {
        "model": "m", "stream": False, "max_tokens": 8, "user": "u1",
        "messages": [{"role": "system", "content": "Be brief."},
                     {"role": "user", "content": "Hi"}]}
    assert isinstance(messages.wire(), MessagesWire) and not messages.is_count
    count = api_call("count_tokens", {"model": "m", "messages": USER})
    assert count.is_count and "max_tokens" not in count.chat_body()
    assert count.count_response(7).body == b'{"input_tokens":7}'
    responses = api_call("responses", {"model": "m", "instructions": "Be brief.",
                                       "input": "Hi", "max_output_tokens": 3, "stream": True})
    assert responses.chat_body() == {
        "model": "m", "stream": True, "max_tokens": 3,
        "messages": [{"role": "system", "content": "Be brief."},
                     {"role": "user", "content": "Hi"}]}
    assert isinstance(responses.wire(), ResponsesWire)


@pytest.mark.parametrize(("status", "kind"), [
    (400, "invalid_request_error"), (404, "not_found_error"), (429, "rate_limit_error"),
    (500, "api_error"), (503, "overloaded_error"),
])
def test_messages_errors_are_anthropics(status: int, kind: str) -> None:
    response = api_error_response("messages", status, "Send fewer messages.", "messages",
                                  "context_length_exceeded")
    assert response.status == status
    assert isinstance(response.body, bytes)
    assert orjson.loads(response.body) == {"type": "error", "error": {
        "type": kind, "message": "Send fewer messages.", "param": "messages",
        "code": "context_length_exceeded"}}


@pytest.mark.parametrize(("message", "param", "renamed", "renamed_param"), [
    pytest.param("Please reduce the length of the messages or set max_tokens to at most 9.",
                 "messages", "Please reduce the length of the input or set max_output_tokens "
                 "to at most 9.", "input", id="context-length"),
    pytest.param("'max_tokens' must be an integer >= 1; got 0.", "max_tokens",
                 "'max_output_tokens' must be an integer >= 1; got 0.", "max_output_tokens",
                 id="max-tokens"),
    pytest.param("messages[2] must be an object.", "messages[2]", "input[2] must be an object.",
                 "input[2]", id="indexed"),
    pytest.param("'max_completion_tokens' is not a messages_count.", "top_p",
                 "'max_completion_tokens' is not a messages_count.", "top_p",
                 id="other-words-kept"),
])
def test_responses_errors_name_the_responses_fields(
        message: str, param: str, renamed: str, renamed_param: str) -> None:
    response = api_error_response("responses", 400, message, param)
    assert isinstance(response.body, bytes)
    assert orjson.loads(response.body) == {"error": {
        "type": "invalid_request_error", "message": renamed, "param": renamed_param,
        "code": None}}

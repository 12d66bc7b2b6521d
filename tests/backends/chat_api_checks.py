"""What every engine's Anthropic Messages and OpenAI Responses answers must hold: the events of
a stream in order, and each API's error shape. The sim, worker and mock tests check their
engine against these."""

from __future__ import annotations

from typing import Any

import pytest

MESSAGES = "/v1/messages"
COUNT_TOKENS = "/v1/messages/count_tokens"
RESPONSES = "/v1/responses"
CHAT = "/v1/chat/completions"
_IMAGE = {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                      "data": "iVBORw0KGgo="}}
_USER = [{"role": "user", "content": "hi"}]

# (path, body, status, param): a body without "model" gets the engine's model.
API_ERRORS = [
    pytest.param(MESSAGES, b"{not json", 400, None, id="messages-not-json"),
    pytest.param(MESSAGES, {"messages": _USER}, 400, "max_tokens", id="messages-no-max-tokens"),
    pytest.param(MESSAGES, {"model": "no-such-model", "max_tokens": 4, "messages": _USER},
                 404, "model", id="messages-unknown-model"),
    pytest.param(MESSAGES, {"max_tokens": 4, "messages": [
        {"role": "user", "content": [{"type": "text", "text": "What is this?"}, _IMAGE]}]},
        400, "image", id="messages-image-block"),
    pytest.param(MESSAGES, {"max_tokens": 4, "messages": [{"role": "system", "content": "x"}]},
                 400, "messages[0].role", id="messages-system-role"),
    pytest.param(COUNT_TOKENS, {"model": "no-such-model", "messages": _USER}, 404, "model",
                 id="count-unknown-model"),
    pytest.param(COUNT_TOKENS, {"messages": [{"role": "user", "content": [_IMAGE]}]}, 400,
                 "image", id="count-image-block"),
    pytest.param(RESPONSES, b"{not json", 400, None, id="responses-not-json"),
    pytest.param(RESPONSES, {"model": "no-such-model", "input": "hi"}, 404, "model",
                 id="responses-unknown-model"),
    pytest.param(RESPONSES, {"input": "hi", "previous_response_id": "resp_1"}, 400,
                 "previous_response_id", id="responses-previous-response-id"),
    pytest.param(RESPONSES, {"input": [{"role": "user", "content": [
        {"type": "input_image", "image_url": "https://example.com/a.png"}]}]}, 400,
        "input_image", id="responses-image"),
    pytest.param(RESPONSES, {"input": []}, 400, "input", id="responses-no-input"),
    pytest.param(RESPONSES, {"input": "hi", "max_output_tokens": 0}, 400, "max_output_tokens",
                 id="responses-max-output-tokens-zero"),
]


def with_model(body: Any, model: str) -> Any:
    """``body`` for an engine serving ``model``: its model filled in unless the case sets one."""
    return {"model": model, **body} if isinstance(body, dict) else body


def check_api_error(path: str, status: int, data: Any, expected_status: int,
                    param: str | None) -> None:
    """An error answer: Anthropic's shape on the Messages routes, OpenAI's on Responses."""
    assert status == expected_status, data
    if path.startswith(MESSAGES):
        assert data["type"] == "error", data
        error = data["error"]
        assert error["type"] == ("not_found_error" if status == 404
                                 else "invalid_request_error")
    else:
        assert set(data) == {"error"}, data
        error = data["error"]
        assert error["type"] == "invalid_request_error"
    assert error["param"] == param, error
    assert error["message"]


def check_messages_events(types: list[str]) -> int:
    """A complete Messages stream's event types in order; the number of text deltas."""
    assert types[:2] == ["message_start", "content_block_start"], types
    assert types[-3:] == ["content_block_stop", "message_delta", "message_stop"], types
    deltas = types[2:-3]
    assert deltas and set(deltas) == {"content_block_delta"}, types
    return len(deltas)


def check_responses_events(events: list[Any], final_type: str) -> str:
    """A complete Responses stream, ending with ``final_type``: its events in order, numbered
    from 0, the final response's text that of the deltas; returns that text."""
    types = [event.type for event in events]
    assert types[:4] == ["response.created", "response.in_progress",
                         "response.output_item.added", "response.content_part.added"], types
    assert types[-4:] == ["response.output_text.done", "response.content_part.done",
                          "response.output_item.done", final_type], types
    assert set(types[4:-4]) == {"response.output_text.delta"}, types
    assert [event.sequence_number for event in events] == list(range(len(events)))
    text = "".join(event.delta for event in events[4:-4])
    assert events[-1].response.output_text == text
    return text


def message_text(message: Any) -> str:
    """The text of a Messages answer: one text block, as a text model writes it."""
    (block,) = message.content
    assert block.type == "text"
    return str(block.text)

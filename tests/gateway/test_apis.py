"""Each client API's wire as the proxy reads it (gateway.apis): stream ends, usage, error
bodies and stream error events, table-driven on bytes from the engines' own wire."""

from __future__ import annotations

import orjson
import pytest

from backends.api_wire import MessagesWire, ResponsesWire, Usage
from gateway.apis import ANTHROPIC, OPENAI, RESPONSES, Api, EventHeads

USAGE = Usage(num_prompt_tokens=40, num_output_tokens=3, num_cached_tokens=32)


def _messages_stream() -> bytes:
    wire = MessagesWire("m")
    return (wire.start(USAGE) + b"".join(wire.delta(w) for w in (" a", " b", " c"))
            + wire.finish("length", USAGE))


def _responses_stream() -> bytes:
    wire = ResponsesWire("m", {"input": "x"})
    return (wire.start(USAGE) + b"".join(wire.delta(w) for w in (" a", " b", " c"))
            + wire.finish("stop", USAGE))


@pytest.mark.parametrize(("api", "stream"), [
    pytest.param(ANTHROPIC, _messages_stream(), id="messages"),
    pytest.param(RESPONSES, _responses_stream(), id="responses"),
])
def test_a_complete_stream_is_seen_to_end_in_any_chunking(api: Api, stream: bytes) -> None:
    cut = stream[:stream.rfind(b"event: ")]  # the last event never came
    for size in (1, 2, 7, 31, 64, 200, len(stream)):
        for whole, is_complete in ((stream, True), (cut, False)):
            heads = EventHeads()
            chunks = [whole[i:i + size] for i in range(0, len(whole), size)]
            for chunk in chunks:
                heads.track(chunk)
            last = b"".join(chunks[-2:])
            assert api.is_stream_end(heads.head, last) is is_complete, (size, heads.head)


def test_a_long_last_event_is_judged_by_its_head() -> None:
    """response.completed holds the whole response: its head may be many chunks back."""
    wire = ResponsesWire("m", {"input": "x"})
    stream = wire.start(USAGE) + wire.delta("word " * 5000) + wire.finish("stop", USAGE)
    heads = EventHeads()
    for i in range(0, len(stream), 1000):
        heads.track(stream[i:i + 1000])
    assert heads.head.startswith(b"event: response.completed")
    assert RESPONSES.is_stream_end(heads.head, stream[-1000:])


def test_a_data_only_stream_with_the_type_last_ends_too() -> None:
    event = b'data: {"response": {"id": "resp_1"}, "type": "response.completed"}\n\n'
    heads = EventHeads()
    heads.track(b'data: {"type": "response.created"}\n\n' + event)
    assert RESPONSES.is_stream_end(heads.head, event)


@pytest.mark.parametrize("text", [
    pytest.param("event: message_stop\n", id="the-event-line-as-text"),
    pytest.param('"type":"message_stop"', id="the-type-as-text"),
])
def test_a_token_that_spells_the_end_does_not_end_a_stream(text: str) -> None:
    event = MessagesWire("m").delta(text)
    heads = EventHeads()
    heads.track(event)
    assert not ANTHROPIC.is_stream_end(heads.head, event)


@pytest.mark.parametrize(("api", "tail", "num_events", "prompt", "cached", "output"), [
    pytest.param(ANTHROPIC, _messages_stream(), 9, 40, 32, 3, id="messages-stream"),
    pytest.param(ANTHROPIC, MessagesWire("m").body("a b c", "stop", USAGE), 0, 40, 32, 3,
                 id="messages-body"),
    pytest.param(RESPONSES, _responses_stream(), 11, 40, 32, 3, id="responses-stream"),
    pytest.param(RESPONSES, ResponsesWire("m", {}).body("a b c", "stop", USAGE), 0, 40, 32,
                 3, id="responses-body"),
    pytest.param(ANTHROPIC, b'event: content_block_delta\ndata: {}\n\n' * 4, 6, None, None, 1,
                 id="no-usage-counts-events"),
    pytest.param(OPENAI, b'"usage":{"prompt_tokens":12,"completion_tokens":4,'
                 b'"prompt_tokens_details":{"cached_tokens":8}}', 0, 12, 8, 4, id="openai"),
])
def test_usage_is_read_in_each_apis_terms(api: Api, tail: bytes, num_events: int,
                                          prompt: int | None, cached: int | None,
                                          output: int) -> None:
    assert api.reported_usage(tail) == (prompt, cached)
    assert api.output_tokens(tail, num_events) == output


def test_errors_take_each_apis_shape() -> None:
    anthropic = orjson.loads(ANTHROPIC.error_body(429, "Slow down.", "rate_limit_error",
                                                  "tenant_rate_limited"))
    assert anthropic == {"type": "error", "error": {
        "type": "rate_limit_error", "message": "Slow down.", "code": "tenant_rate_limited",
        "param": None}}
    engine_error = orjson.dumps({"error": {"message": "Too long.", "type": "BadRequestError",
                                           "param": "messages", "code": 400}})
    assert ANTHROPIC.is_error_body(engine_error)
    converted = orjson.loads(ANTHROPIC.client_error_body(400, engine_error))
    assert converted["type"] == "error"
    assert converted["error"]["type"] == "invalid_request_error"
    assert converted["error"]["message"] == "Too long."
    assert RESPONSES.client_error_body(400, engine_error) == engine_error
    assert not OPENAI.is_error_body(b'{"detail": "Not Found"}')


@pytest.mark.parametrize(("api", "check"), [
    pytest.param(OPENAI, lambda data: data["error"]["code"] == "upstream_failed", id="openai"),
    pytest.param(ANTHROPIC, lambda data: data["type"] == "error"
                 and data["error"]["type"] == "api_error", id="anthropic"),
    pytest.param(RESPONSES, lambda data: data["type"] == "error"
                 and data["error"]["message"] == data["message"], id="responses"),
])
def test_a_broken_stream_ends_with_an_event_its_sdk_raises_on(api: Api, check: object) -> None:
    event = api.stream_error("Upstream failed.", "upstream_error", "upstream_failed")
    assert event.endswith(b"\n\n")
    data = orjson.loads(event.split(b"data: ", 1)[1])
    assert check(data)  # type: ignore[operator]
    assert event.startswith(b"data: " if api is OPENAI else b"event: error\n")

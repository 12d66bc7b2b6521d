"""The fuzz run's checks catch what they claim to: a table of replies, each fine or not."""

from __future__ import annotations

import orjson
import pytest

from gateway.openapi import document
from tests.fuzz.checks import Checker
from tests.fuzz.http_cases import Case
from tests.fuzz.wire import CUT_SHORT, Reply

CHECKER = Checker(document())
CHAT = Case("POST /v1/chat/completions", "POST", "/v1/chat/completions",
            body=orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}))
JSON = {"content-type": "application/json", "x-request-id": "req-1"}
MESSAGES = b'{"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}'


def error(status: int, code: str | None = "c", headers: dict[str, str] | None = None,
          **fields: object) -> Reply:
    body = {"message": "m", "type": "t", "param": None, "code": code, **fields}
    return Reply(status, {**JSON, **(headers or {})}, orjson.dumps({"error": body}))


COMPLETION = orjson.dumps({"id": "c", "object": "chat.completion", "model": "m",
                           "choices": [], "usage": {}})


@pytest.mark.parametrize(("case", "reply", "expected"), [
    pytest.param(CHAT, Reply(200, JSON, COMPLETION), [], id="a-completion"),
    pytest.param(CHAT, error(400), [], id="an-openai-error"),
    pytest.param(CHAT, error(503, "overloaded", {"retry-after": "1"}), [], id="overloaded"),
    pytest.param(CHAT, error(503, "overloaded"), ["gateway answered 503"],
                 id="overloaded-without-retry-after"),
    pytest.param(CHAT, error(500), ["gateway answered 500"], id="a-500"),
    pytest.param(CHAT, error(502, "upstream_failed"), ["gateway answered 502"], id="a-502"),
    pytest.param(CHAT, Reply(417, {"content-type": "text/plain", "x-request-id": "r"}, b"no"),
                 ["content-type 'text/plain', not application/json"], id="plain-text"),
    pytest.param(CHAT, Reply(400, JSON, b'{"detail": "x"}'), ["no 'error' object"],
                 id="not-openai-shaped"),
    pytest.param(CHAT, error(400, message=""), ["error.message is not a non-empty string"],
                 id="empty-message"),
    pytest.param(CHAT, error(400, type=None), ["error.type is not a string"], id="no-type"),
    pytest.param(CHAT, Reply(400, {"content-type": "application/json"}, error(400).body),
                 ["no x-request-id header"], id="no-request-id"),
    pytest.param(CHAT, None, ["the gateway closed the connection without an answer"],
                 id="no-answer"),
    pytest.param(Case(CUT_SHORT, raw=b"GET /"), None, [], id="no-answer-to-a-cut-short-one"),
    pytest.param(CHAT, Reply(200, JSON, b'{"object": "chat.completion"}'),
                 ["the 200 body does not match the document: 'choices' is a required "
                  "property"], id="a-completion-without-choices"),
    pytest.param(CHAT, Reply(200, {**JSON, "content-type": "text/event-stream"}, b"data: {}\n\n"),
                 ["the stream does not end with 'data: [DONE]'"], id="a-stream-cut-short"),
    pytest.param(Case("POST /v1/messages", "POST", "/v1/messages", body=MESSAGES),
                 Reply(200, {**JSON, "content-type": "text/event-stream"},
                       b'event: message_start\ndata: {"type":"message_start"}\n\n'),
                 ["the stream does not end with 'data: {\"type\":\"message_stop\"}'"],
                 id="a-messages-stream-cut-short"),
    pytest.param(Case("POST /v1/responses", "POST", "/v1/responses",
                      body=b'{"model": "m", "input": "hi"}'),
                 Reply(200, {**JSON, "content-type": "text/event-stream"},
                       b'event: response.output_text.delta\ndata: {}\n\n'
                       b'event: error\ndata: {"type":"error"}\n\n'),
                 ["the stream does not end with 'event: response.completed'",
                  "the stream holds an error event"], id="a-responses-stream-that-failed"),
    pytest.param(Case("POST /v1/messages", "POST", "/v1/messages"),
                 Reply(400, JSON, error(400).body),
                 ["'type' is not 'error'"], id="an-openai-error-on-an-anthropic-path"),
    pytest.param(Case("POST /v1/chat/completions", "POST", "/v1/chat/completions",
                      body=b'{"model": 5, "messages": [{"role": "user"}]}'),
                 Reply(200, JSON, COMPLETION),
                 ["accepted a body the document refuses: 5 is not of type 'string'"],
                 id="accepted-a-refused-body"),
    pytest.param(Case("GET /v1/models", "DELETE", "/v1/models", is_documented=False),
                 Reply(200, JSON, b"{}"), ["200 to an undocumented method or path"],
                 id="served-a-wrong-method"),
])
def test_checks(case: Case, reply: Reply | None, expected: list[str]) -> None:
    assert CHECKER.problems(case, reply) == expected

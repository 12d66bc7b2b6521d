"""Bad requests of every kind get an OpenAI-format error that says what to change.

One table: each row is sent to the shared gateway with httpx, or over a raw socket where httpx
would refuse to send it, and must get its status, an ``{"error": {...}}`` body with the right
``param``, and an ``x-request-id``. The gateway must still serve normally afterwards.
"""

from __future__ import annotations

import gzip
import socket
import uuid
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson
import pytest

from tests.fleet import MODEL, Gateway
from tests.raw_http import read_answer

KEY = "<KEY>"  # replaced by the shared tenant key when the row is sent
CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
MESSAGES = [{"role": "user", "content": "hello"}]
NINE_MIB = 9 * 1024 * 1024


@dataclass(frozen=True)
class Reply:
    status: int
    headers: dict[str, list[str]]  # lower-case names
    body: bytes

    def header(self, name: str) -> str | None:
        values = self.headers.get(name.lower())
        return values[0] if values else None


@dataclass(frozen=True)
class Case:
    status: int
    needle: str  # a phrase of the message that tells the client what to change
    param: str | None = None
    code: str | None = None
    method: str = "POST"
    path: str = CHAT
    json: Any = None
    content: bytes | None = None
    headers: dict[str, str] = field(default_factory=lambda: {"Authorization": f"Bearer {KEY}"})
    raw: bytes | None = None  # the whole request, sent over a socket as is
    absent: tuple[str, ...] = ()  # must not appear anywhere in the response head


def chat(**fields: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": MESSAGES, **fields}


def completion(**fields: Any) -> dict[str, Any]:
    return {"model": MODEL, "prompt": "hello", **fields}


def raw_get(*header_lines: bytes) -> bytes:
    return b"GET /healthz HTTP/1.1\r\nHost: gateway\r\n" + b"".join(
        line + b"\r\n" for line in header_lines
    ) + b"\r\n"


MALFORMED_KEY = "sy-<16 hex>-<43 characters>"

CASES = [
    # -- bodies that are not a JSON object ---------------------------------------------------
    pytest.param(Case(400, "not valid JSON", code="invalid_json", content=b'{"model": '),
                 id="malformed-json"),
    pytest.param(Case(400, "must be a JSON object, not an array", code="invalid_json",
                      content=b"[1, 2]"), id="body-is-array"),
    pytest.param(Case(400, "must be a JSON object, not a string", code="invalid_json",
                      content=b'"hello"'), id="body-is-string"),
    pytest.param(Case(400, "body is empty", content=b""), id="empty-body"),
    pytest.param(Case(400, "'prompt'", content=b"", path=COMPLETIONS), id="empty-completions"),
    # -- fields of the wrong type or out of range --------------------------------------------
    pytest.param(Case(400, "expected an array", "messages", json=chat(messages="hi")),
                 id="messages-not-a-list"),
    pytest.param(Case(400, "at least one message", "messages", json=chat(messages=[])),
                 id="messages-empty"),
    pytest.param(Case(400, "expected an object", "messages[0]", json=chat(messages=["hi"])),
                 id="message-not-an-object"),
    pytest.param(Case(400, "expected one of", "messages[1].role",
                      json=chat(messages=[*MESSAGES, {"role": "robot", "content": "x"}])),
                 id="unknown-role"),
    pytest.param(Case(400, "expected a string or an array", "messages[0].content",
                      json=chat(messages=[{"role": "user", "content": 7}])),
                 id="content-not-string"),
    pytest.param(Case(400, "expected a boolean", "stream", json=chat(stream="yes")),
                 id="stream-yes"),
    pytest.param(Case(400, "must be >= 1", "max_tokens", json=chat(max_tokens=-1)),
                 id="max-tokens-negative"),
    pytest.param(Case(400, "expected an integer", "max_tokens", json=chat(max_tokens="10")),
                 id="max-tokens-string"),
    pytest.param(Case(400, "expected an integer", "max_tokens", json=chat(max_tokens=1.5)),
                 id="max-tokens-float"),
    pytest.param(Case(400, "expected an integer", "max_tokens", json=chat(max_tokens=True)),
                 id="max-tokens-bool"),
    pytest.param(Case(400, "between 0 and 2", "temperature", json=chat(temperature=5)),
                 id="temperature-5"),
    pytest.param(Case(400, "between 0 and 1", "top_p", json=chat(top_p=-0.1)),
                 id="top-p-negative"),
    pytest.param(Case(400, "between 1 and 128", "n", json=chat(n=0)), id="n-0"),
    pytest.param(Case(400, "expected a string or an array of up to 16", "stop",
                      json=chat(stop=[1, 2])), id="stop-ints"),
    pytest.param(Case(400, "expected a boolean", "stream_options.include_usage",
                      json=chat(stream=True, stream_options={"include_usage": "y"})),
                 id="include-usage-string"),
    pytest.param(Case(400, "expected a string, an array of strings", "prompt",
                      path=COMPLETIONS, json=completion(prompt=12)), id="prompt-12"),
    pytest.param(Case(400, "expected a string, an array of strings", "prompt",
                      path=COMPLETIONS, json=completion(prompt=[])), id="prompt-empty-list"),
    pytest.param(Case(400, "expected a string, an array of strings", "prompt",
                      path=COMPLETIONS, json=completion(prompt=["a", 1])), id="prompt-mixed"),
    pytest.param(Case(400, "token ids are integers from 0 to 4294967295", "prompt",
                      path=COMPLETIONS, json=completion(prompt=[1, -1])), id="token-id-negative"),
    pytest.param(Case(400, "token ids are integers from 0 to 4294967295", "prompt",
                      path=COMPLETIONS, json=completion(prompt=[[5], [2**32]])),
                 id="token-id-over-32-bits"),
    pytest.param(Case(400, "Invalid type for 'cache_salt': expected a string", "cache_salt",
                      json=chat(cache_salt=5)), id="cache-salt-number"),
    pytest.param(Case(400, "Invalid type for 'cache_salt': expected a string", "cache_salt",
                      json=chat(cache_salt={"a": 1})), id="cache-salt-object"),
    # -- missing or unknown fields -----------------------------------------------------------
    pytest.param(Case(400, "Missing required parameter: 'model'", "model",
                      json={"messages": MESSAGES}), id="missing-model"),
    pytest.param(Case(400, "non-empty string", "model", json=chat(model=5)),
                 id="model-not-string"),
    pytest.param(Case(400, "non-empty string", "model", json=chat(model="")), id="model-empty"),
    pytest.param(Case(404, "GET /v1/models lists", "model", code="model_not_found",
                      json=chat(model="no-such-model")), id="unknown-model"),
    pytest.param(Case(404, "does not exist", "model", code="model_not_found", method="GET",
                      path="/v1/models/no-such-model"), id="unknown-model-get"),
    pytest.param(Case(400, "Missing required parameter: 'messages'", "messages",
                      json={"model": MODEL}), id="missing-messages"),
    pytest.param(Case(400, "Missing required parameter: 'prompt'", "prompt",
                      path=COMPLETIONS, json={"model": MODEL}), id="missing-prompt"),
    # -- the envelope: content type, size ----------------------------------------------------
    pytest.param(Case(415, "Content-Type: application/json", code="unsupported_media_type",
                      content=orjson.dumps(chat()),
                      headers={"Authorization": f"Bearer {KEY}", "Content-Type": "text/plain"}),
                 id="text-plain"),
    pytest.param(Case(415, "Content-Type: application/json", code="unsupported_media_type",
                      content=b"model=x",
                      headers={"Authorization": f"Bearer {KEY}",
                               "Content-Type": "application/x-www-form-urlencoded"}),
                 id="form-encoded"),
    pytest.param(Case(413, "raise max_body_bytes", code="request_too_large",
                      raw=f"POST {CHAT} HTTP/1.1\r\nHost: gateway\r\n"
                          f"Authorization: Bearer {KEY}\r\nContent-Type: application/json\r\n"
                          f"Content-Length: {NINE_MIB}\r\n\r\n".encode()),
                 id="content-length-over-8-mib"),
    # A small gzip body that inflates past the limit: its Content-Length passes, its bytes
    # arrive at once, and the inflated body is judged.
    pytest.param(Case(413, "raise max_body_bytes", code="request_too_large",
                      content=gzip.compress(orjson.dumps(chat(messages=[
                          {"role": "user", "content": "x" * NINE_MIB}]))),
                      headers={"Authorization": f"Bearer {KEY}",
                               "Content-Type": "application/json", "Content-Encoding": "gzip"}),
                 id="gzip-inflating-over-8-mib"),
    pytest.param(Case(400, "not gzip-compressed", code="invalid_content_encoding",
                      content=orjson.dumps(chat()),
                      headers={"Authorization": f"Bearer {KEY}",
                               "Content-Type": "application/json", "Content-Encoding": "gzip"}),
                 id="gzip-header-plain-body"),
    pytest.param(Case(400, "not deflate-compressed", code="invalid_content_encoding",
                      content=orjson.dumps(chat()),
                      headers={"Authorization": f"Bearer {KEY}",
                               "Content-Type": "application/json",
                               "Content-Encoding": "deflate"}),
                 id="deflate-header-plain-body"),
    # An encoding aiohttp cannot decode fails the HTTP parse, before the gateway's handler.
    pytest.param(Case(400, "can not decode content-encoding", code="invalid_http",
                      raw=f"POST {CHAT} HTTP/1.1\r\nHost: gateway\r\n"
                          f"Authorization: Bearer {KEY}\r\nContent-Type: application/json\r\n"
                          "Content-Encoding: zstd\r\nContent-Length: 2\r\n\r\n{}".encode()),
                 id="unknown-content-encoding"),
    pytest.param(Case(417, "Expect: 100-continue", code="expectation_failed",
                      raw=f"POST {CHAT} HTTP/1.1\r\nHost: gateway\r\n"
                          f"Authorization: Bearer {KEY}\r\nContent-Type: application/json\r\n"
                          "Expect: the-unusual\r\nContent-Length: 2\r\n\r\n{}".encode()),
                 id="unusual-expect"),
    # -- credentials -------------------------------------------------------------------------
    pytest.param(Case(401, "Authorization: Bearer sy-", code="missing_api_key",
                      json=chat(), headers={}), id="no-authorization"),
    pytest.param(Case(401, MALFORMED_KEY, code="invalid_api_key", json=chat(),
                      headers={"Authorization": KEY}), id="key-without-bearer"),
    pytest.param(Case(401, MALFORMED_KEY, code="invalid_api_key", json=chat(),
                      headers={"Authorization": "Basic x"}), id="basic-auth"),
    pytest.param(Case(401, MALFORMED_KEY, code="invalid_api_key", json=chat(),
                      headers={"Authorization": "Bearer"}), id="bearer-alone"),
    pytest.param(Case(401, MALFORMED_KEY, code="invalid_api_key", json=chat(),
                      headers={"Authorization": "Bearer sy-short"}), id="bearer-sy-short"),
    pytest.param(Case(401, MALFORMED_KEY, code="invalid_api_key", json=chat(),
                      headers={"Authorization": "Bearer sk-proj-" + "a" * 48}),
                 id="openai-style-key"),
    pytest.param(Case(401, MALFORMED_KEY, code="invalid_api_key", json=chat(),
                      headers={"Authorization": f"Bearer {KEY}x"}), id="key-with-suffix"),
    pytest.param(Case(401, "no such key", code="invalid_api_key", json=chat(),
                      headers={"Authorization": "Bearer sy-0123456789abcdef-" + "Q" * 43}),
                 id="well-formed-unknown-key"),
    pytest.param(Case(401, MALFORMED_KEY, code="invalid_api_key", method="GET",
                      path="/v1/models", headers={"Authorization": "Bearer sy-short"}),
                 id="models-with-malformed-key"),
    # -- headers, paths, methods -------------------------------------------------------------
    pytest.param(Case(400, "1-128 characters", "x-request-id", code="invalid_header",
                      json=chat(), headers={"Authorization": f"Bearer {KEY}",
                                            "x-request-id": "has spaces in it"}),
                 id="request-id-with-spaces"),
    pytest.param(Case(400, "1-128 characters", "x-request-id", code="invalid_header",
                      json=chat(), headers={"Authorization": f"Bearer {KEY}",
                                            "x-request-id": "r" * 129}),
                 id="request-id-too-long"),
    pytest.param(Case(404, "/v1/chat/completions", code="unknown_url", path="/v1/nope",
                      json=chat()), id="unknown-path"),
    pytest.param(Case(404, "/v1/chat/completions", code="unknown_url", method="GET",
                      path="/", json=None), id="root-path"),
    pytest.param(Case(405, "use POST", code="method_not_allowed", method="GET", path=CHAT),
                 id="get-chat"),
    pytest.param(Case(405, "use POST", code="method_not_allowed", method="PUT",
                      path=COMPLETIONS, json=completion()), id="put-completions"),
    pytest.param(Case(405, "use GET", code="method_not_allowed", method="DELETE",
                      path="/v1/models"), id="delete-models"),
    # -- unparsable HTTP, over a raw socket ---------------------------------------------------
    pytest.param(Case(400, "well-formed HTTP", code="invalid_http",
                      raw=raw_get(b"X-Test: a\rInjected: yes"), absent=("injected",)),
                 id="cr-in-header-value"),
    pytest.param(Case(400, "well-formed HTTP", code="invalid_http",
                      raw=raw_get(b"X-Test: a\nInjected: yes"), absent=("injected",)),
                 id="lf-in-header-value"),
    pytest.param(Case(400, "well-formed HTTP", code="invalid_http",
                      raw=raw_get(b"X-Request-Id: abc\rSet-Cookie: evil=1"),
                      absent=("set-cookie", "evil")),
                 id="cr-in-request-id"),
    pytest.param(Case(400, "well-formed HTTP", code="invalid_http",
                      raw=raw_get(b"X-Test: a\x00Injected: yes"), absent=("injected",)),
                 id="nul-in-header-value"),
    pytest.param(Case(400, "well-formed HTTP", code="invalid_http",
                      raw=raw_get(b"X-Test: a", b" Injected: yes"), absent=("injected",)),
                 id="obs-fold-continuation"),
    pytest.param(Case(400, "well-formed HTTP", code="invalid_http",
                      raw=raw_get(b"Injected yes"), absent=("injected",)),
                 id="header-without-colon"),
    pytest.param(Case(400, "longer than 16384 bytes", code="invalid_http",
                      raw=raw_get(b"X-Big: " + b"A" * 20_000), absent=("aaaa",)),
                 id="20-kb-header"),
    pytest.param(Case(400, "well-formed HTTP", code="invalid_http",
                      raw=b"GET /healthz HTTP/1.1\r\nHost: gateway\r\nContent-Length: 1\r\n"
                          b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n"),
                 id="content-length-with-chunked"),
]


def send_raw(port: int, data: bytes) -> Reply:
    """Send bytes as they are; read one response (headers, then Content-Length bytes)."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(data)
        status_line, headers, body, _ = read_answer(sock)
    return Reply(int(status_line.split()[1]), headers, body)


def send(gateway: Gateway, case: Case, key: str, request_id: str) -> Reply:
    if case.raw is not None:
        return send_raw(gateway.port, case.raw.replace(KEY.encode(), key.encode()))
    headers = {name: value.replace(KEY, key) for name, value in case.headers.items()}
    headers.setdefault("x-request-id", request_id)
    response = httpx.request(
        case.method, gateway.url + case.path, headers=headers, json=case.json,
        content=case.content, timeout=10,
    )
    multi: dict[str, list[str]] = {}
    for name, value in response.headers.multi_items():
        multi.setdefault(name.lower(), []).append(value)
    return Reply(response.status_code, multi, response.content)


@pytest.mark.parametrize("case", CASES)
def test_bad_input_gets_an_openai_error(gateway: Gateway, api_key: str, case: Case) -> None:
    request_id = f"bad-{uuid.uuid4().hex}"
    reply = send(gateway, case, api_key, request_id)

    assert reply.status == case.status, reply.body
    assert reply.header("content-type") == "application/json", reply.headers
    error = orjson.loads(reply.body)["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["param"] == case.param
    if case.code is not None:
        assert error["code"] == case.code
    expected_type = {401: "authentication_error", 403: "permission_error"}.get(
        case.status, "invalid_request_error"
    )
    assert error["type"] == expected_type
    assert case.needle.lower() in error["message"].lower(), error["message"]

    returned_id = reply.header("x-request-id")
    assert returned_id, "every response carries x-request-id"
    if case.raw is None and "x-request-id" not in case.headers:
        assert returned_id == request_id  # a valid id from the client is echoed back
    else:
        assert returned_id.startswith("req-")  # otherwise the gateway makes one
    if case.status == 401:
        assert reply.header("www-authenticate") == 'Bearer realm="switchyard"'
    if case.status == 405:
        assert reply.header("allow")
    assert api_key not in reply.body.decode("utf-8", "replace")
    head = "\n".join(f"{name}: {v}" for name, values in reply.headers.items() for v in values)
    for forbidden in case.absent:
        assert forbidden not in head.lower(), head


def test_the_gateway_still_serves_after_the_table(gateway: Gateway, api_key: str) -> None:
    assert httpx.get(gateway.url + "/healthz", timeout=5).json() == {"status": "alive"}
    assert httpx.get(gateway.url + "/readyz", timeout=5).status_code == 200
    response = httpx.post(
        gateway.url + CHAT, headers={"Authorization": f"Bearer {api_key}"}, timeout=10,
        json=chat(max_tokens=3),
    )
    assert response.status_code == 200, response.text
    assert response.json()["usage"]["completion_tokens"] == 3
    assert response.headers["x-request-id"].startswith("req-")
    # A keep-alive connection that carried a bad request still carries a good one.
    with httpx.Client(base_url=gateway.url, timeout=10,
                      headers={"Authorization": f"Bearer {api_key}"}) as client:
        assert client.post(CHAT, json=chat(temperature=9)).status_code == 400
        assert client.post(CHAT, content=b"{").status_code == 400
        assert client.post(CHAT, json=chat(max_tokens=1)).status_code == 200

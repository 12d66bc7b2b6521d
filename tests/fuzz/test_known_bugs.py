"""The bugs the fuzz run found, one exact reproducer each, kept as regression tests now that
each is fixed. A bug found next goes in ``known_bugs.py`` with a strict xfail here until its
fix lands."""

from __future__ import annotations

import socket

import httpx
import orjson
import pytest

from tests.fuzz.checks import error_problems
from tests.fuzz.conftest import MODEL, Fleet
from tests.fuzz.known_bugs import KNOWN_BUGS
from tests.fuzz.wire import Reply


def _reply(response: httpx.Response) -> Reply:
    return Reply(response.status_code, {k.lower(): v for k, v in response.headers.items()},
                 response.content)


def _assert_openai_error(response: httpx.Response, status: int) -> None:
    assert response.status_code == status, response.text
    assert not error_problems(_reply(response)), response.text
    assert "x-request-id" in response.headers


def test_every_known_bug_has_its_reproducer() -> None:
    names = {bug.name for bug in KNOWN_BUGS}
    assert names <= {name.removeprefix("test_") for name in globals()
                     if name.startswith("test_")}


def test_admin_body_with_a_bad_content_encoding_is_a_400(fleet: Fleet) -> None:
    response = fleet.gateway.admin.post(
        "/admin/tenants", content=b'{"name": "x"}',
        headers={"Content-Type": "application/json", "Content-Encoding": "gzip"})
    _assert_openai_error(response, 400)


@pytest.mark.parametrize("query", [
    pytest.param({"from": "9999-12-31T00:00:00", "to": "9999-12-31T23:59:59"}, id="year-9999"),
    pytest.param({"from": "0001-01-01T00:00:00+01:00", "to": "0001-01-02T00:00:00"},
                 id="before-year-1"),
])
def test_admin_usage_with_a_time_out_of_range_is_a_400(fleet: Fleet,
                                                       query: dict[str, str]) -> None:
    _assert_openai_error(fleet.gateway.admin.get("/admin/usage", params=query), 400)


@pytest.mark.parametrize(("method", "path"), [
    pytest.param("GET", "/v1/nothing-here", id="unknown-path"),
    pytest.param("PUT", "/v1/chat/completions", id="wrong-method"),
])
def test_an_unusual_expect_on_an_unrouted_request_gets_an_openai_error(
    fleet: Fleet, method: str, path: str
) -> None:
    response = httpx.request(method, fleet.gateway.url + path, timeout=10,
                             headers={"Expect": "the-unusual"})
    _assert_openai_error(response, 417)


def test_a_bad_content_encoding_leaves_the_connection_usable_or_closes_it(
    fleet: Fleet,
) -> None:
    body = orjson.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}]})
    request = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: gateway\r\n"
               f"Authorization: Bearer {fleet.credentials.tenant_key}\r\n"
               f"Content-Type: application/json\r\nContent-Encoding: gzip\r\n"
               f"Content-Length: {len(body)}\r\n\r\n").encode() + body
    with socket.create_connection(("127.0.0.1", fleet.gateway.port), timeout=5) as sock:
        sock.sendall(request)
        head = sock.recv(65536)
        assert head.startswith(b"HTTP/1.1 400 "), head
        if b"\r\nconnection: close\r\n" in head.lower():
            return  # the client knows not to reuse it
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: gateway\r\n\r\n")
        assert sock.recv(65536).startswith(b"HTTP/1.1 200 "), "the connection was dropped"

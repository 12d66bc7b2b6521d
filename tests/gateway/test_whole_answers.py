"""A non-streaming answer is written to the client's socket in one piece by the gateway
(``gateway.relay.write_whole``), not by aiohttp: read here byte for byte over raw sockets.

Its head must be what aiohttp would send (status line, Date, Content-Length, the answer's and
the gateway's headers), the connection must stay open for the next request, and where the
gateway leaves the writing to aiohttp (HTTP/1.0, ``Connection: close``) the answer must be as
complete and the connection closed as the client asked.
"""

from __future__ import annotations

import socket
from email.utils import parsedate_to_datetime

import orjson

from tests.fleet import MODEL, Gateway
from tests.raw_http import read_answer

CHAT = "/v1/chat/completions"


def _request(key: str, request_id: str, *, version: str = "HTTP/1.1",
             extra: str = "") -> bytes:
    body = orjson.dumps({"model": MODEL, "max_tokens": 4,
                         "messages": [{"role": "user", "content": "hello"}]})
    return (f"POST {CHAT} {version}\r\nHost: gateway\r\nAuthorization: Bearer {key}\r\n"
            f"Content-Type: application/json\r\nx-request-id: {request_id}\r\n{extra}"
            f"Content-Length: {len(body)}\r\n\r\n").encode() + body


def _closed_by_server(sock: socket.socket) -> bool:
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def test_answers_on_one_kept_connection_are_whole_and_well_formed(gateway: Gateway) -> None:
    key = gateway.new_key(limits={"requests_per_minute": 1000})
    with socket.create_connection(("127.0.0.1", gateway.port), timeout=10) as sock:
        buffered = b""
        for index in range(3):
            sock.sendall(_request(key, f"whole-{index}"))
            status_line, headers, body, buffered = read_answer(sock, buffered)
            assert status_line == "HTTP/1.1 200 OK"
            assert buffered == b""  # nothing sent past the answer
            single = {name: values[0] for name, values in headers.items()}
            assert all(len(values) == 1 for values in headers.values()), headers
            assert single["content-type"] == "application/json"
            assert single["x-request-id"] == f"whole-{index}"
            assert single["x-switchyard-model"] == MODEL
            assert int(single["x-ratelimit-limit-requests"]) == 1000
            assert int(single["x-ratelimit-remaining-requests"]) == 999 - index
            assert parsedate_to_datetime(single["date"]).tzinfo is not None
            assert "connection" not in single and "transfer-encoding" not in single
            answer = orjson.loads(body)
            assert answer["object"] == "chat.completion" and answer["choices"]


def test_an_http10_client_gets_its_answer_and_the_connection_closes(gateway: Gateway,
                                                                    api_key: str) -> None:
    with socket.create_connection(("127.0.0.1", gateway.port), timeout=10) as sock:
        sock.sendall(_request(api_key, "whole-http10", version="HTTP/1.0"))
        status_line, headers, body, rest = read_answer(sock)
        assert status_line.startswith("HTTP/1.") and status_line.split()[1] == "200"
        assert headers["x-request-id"] == ["whole-http10"]
        assert orjson.loads(body)["choices"]
        assert rest == b"" and _closed_by_server(sock)


def test_connection_close_is_honoured(gateway: Gateway, api_key: str) -> None:
    with socket.create_connection(("127.0.0.1", gateway.port), timeout=10) as sock:
        sock.sendall(_request(api_key, "whole-close", extra="Connection: close\r\n"))
        status_line, headers, body, rest = read_answer(sock)
        assert status_line == "HTTP/1.1 200 OK"
        assert headers["connection"] == ["close"]
        assert orjson.loads(body)["choices"]
        assert rest == b"" and _closed_by_server(sock)

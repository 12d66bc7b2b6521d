"""Slow and idle clients are timed out: a connection that sends nothing, a head trickled a
byte at a time, a body that never completes, an idle keep-alive connection. Each is closed
(with an OpenAI-format 408 where a request had begun) and the gateway serves everyone else."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

import httpx
import pytest

from gateway.cli.localproc import ProcessGroup
from tests.fleet import MODEL, Engine, Gateway

LISTEN = {"header_timeout_s": 1.0, "body_timeout_s": 1.0, "keepalive_timeout_s": 1.5}


@pytest.fixture(scope="module")
def slow_gateway(procs: ProcessGroup, workdir: Path, redis_url: str,
                 engines: list[Engine]) -> Gateway:
    return Gateway(procs, workdir, redis_url, [engines[0].backend_config()], listen=LISTEN)


def _connect(gateway: Gateway) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", gateway.port), timeout=5)
    sock.settimeout(5)
    return sock


def _read_all(sock: socket.socket) -> tuple[bytes, float]:
    """Everything until the server closes; and how long that took."""
    started = time.monotonic()
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data, time.monotonic() - started


def _json_of(response: bytes) -> dict[str, object]:
    return dict(json.loads(response.partition(b"\r\n\r\n")[2]))


def test_a_connection_that_sends_nothing_is_closed(slow_gateway: Gateway) -> None:
    with _connect(slow_gateway) as sock:
        data, elapsed_s = _read_all(sock)
    assert data == b"" and 0.8 < elapsed_s < 3


def test_a_trickled_head_gets_a_408_and_is_closed(slow_gateway: Gateway) -> None:
    with _connect(slow_gateway) as sock:
        started = time.monotonic()
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")
        try:
            for byte in b"X-Slow: " + b"a" * 20:  # one byte every 0.2 s: never a whole head
                sock.sendall(bytes([byte]))
                time.sleep(0.2)
        except (BrokenPipeError, ConnectionResetError):
            pass
        data, _ = _read_all(sock)
    assert data.startswith(b"HTTP/1.1 408"), data[:80]
    assert _json_of(data)["error"]["code"] == "request_timeout"  # type: ignore[index]
    assert time.monotonic() - started < 3


def test_a_body_that_never_completes_gets_a_408(slow_gateway: Gateway, api_key: str) -> None:
    with _connect(slow_gateway) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                     b"Authorization: Bearer " + api_key.encode() + b"\r\n"
                     b"Content-Type: application/json\r\nContent-Length: 400\r\n\r\n{\"model\"")
        started = time.monotonic()
        data = sock.recv(65536)
    assert data.startswith(b"HTTP/1.1 408"), data[:80]
    error = _json_of(data)["error"]
    assert error["code"] == "request_timeout" and "body" in error["message"]  # type: ignore[index]
    assert 0.8 < time.monotonic() - started < 3


def test_an_idle_keepalive_connection_is_closed(slow_gateway: Gateway, api_key: str) -> None:
    with httpx.Client(base_url=slow_gateway.url, timeout=5) as client:
        first = client.get("/healthz")
        assert first.status_code == 200
        time.sleep(2.5)  # past keepalive_timeout_s: the server closed it; httpx reconnects
        body = {"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
        again = client.post("/v1/chat/completions", json=body,
                            headers={"Authorization": f"Bearer {api_key}"})
        assert again.status_code == 200
    with _connect(slow_gateway) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        data, elapsed_s = _read_all(sock)
    assert data.startswith(b"HTTP/1.1 200") and 1.0 < elapsed_s < 4

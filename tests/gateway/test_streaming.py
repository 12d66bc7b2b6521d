"""Streams through the gateway: relayed as they arrive, cancelled upstream, ended cleanly on errors.

A dedicated engine and gateways, in a process group of their own, keep this module's engine
counters to itself.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from gateway.cli.localproc import ProcessGroup
from tests.fleet import MODEL, Engine, Gateway, process_group, wait_until

MESSAGES = [{"role": "user", "content": "one two three"}]


class Streams:
    """Opens chat streams with the `openai` SDK, one client per gateway, all with one key.

    Example::

        stream = streams.open(gateway, max_tokens=8, token_delay_ms=50)  # "mock" controls
    """

    def __init__(self, key: str) -> None:
        self.key = key
        self._clients: dict[str, openai.OpenAI] = {}

    def client(self, gateway: Gateway) -> openai.OpenAI:
        client = self._clients.get(gateway.url)
        if client is None:
            client = openai.OpenAI(base_url=gateway.url + "/v1", api_key=self.key,
                                   max_retries=0, timeout=20)
            self._clients[gateway.url] = client
        return client

    def open(self, gateway: Gateway, max_tokens: int, **mock: Any) -> openai.Stream[Any]:
        return self.client(gateway).chat.completions.create(
            model=MODEL, messages=MESSAGES, max_tokens=max_tokens, stream=True,
            extra_body={"mock": mock},
        )

    def assert_serves(self, gateway: Gateway) -> None:
        chunks = list(self.open(gateway, max_tokens=3))
        assert chunks[-1].choices[0].finish_reason == "length"

    def close(self) -> None:
        for client in self._clients.values():
            client.close()


@pytest.fixture(scope="module")
def streams(api_key: str) -> Iterator[Streams]:
    opener = Streams(api_key)
    yield opener
    opener.close()


@pytest.fixture(scope="module")
def module_group() -> Iterator[ProcessGroup]:
    """This module's own processes: a child another module stopped in `procs` cannot fail them."""
    with process_group() as group:
        yield group


@pytest.fixture(scope="module")
def stream_engine(module_group: ProcessGroup) -> Engine:
    return Engine(module_group, "stream-engine")


@pytest.fixture(scope="module")
def stream_gateway(module_group: ProcessGroup, workdir: Path, redis_url: str,
                   stream_engine: Engine) -> Gateway:
    return Gateway(module_group, workdir, redis_url, [stream_engine.backend_config()])


@pytest.fixture(scope="module")
def idle_gateway(module_group: ProcessGroup, workdir: Path, redis_url: str,
                 stream_engine: Engine) -> Gateway:
    """A gateway that gives up on a stream silent for more than 0.3 s."""
    return Gateway(module_group, workdir, redis_url, [stream_engine.backend_config()],
                   upstream={"idle_timeout_s": 0.3})


def raw_events(gateway: Gateway, key: str, max_tokens: int, **mock: Any) -> list[Any]:
    """The SSE data of one stream read with plain httpx, until the server ends the body."""
    body = {"model": MODEL, "messages": MESSAGES, "max_tokens": max_tokens, "stream": True,
            "mock": mock}
    events: list[Any] = []
    with httpx.stream("POST", gateway.url + "/v1/chat/completions", json=body, timeout=20,
                      headers={"Authorization": f"Bearer {key}"}) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        for line in response.iter_lines():  # raises if the body is cut off
            if line.startswith("data: "):
                data = line.removeprefix("data: ")
                events.append(data if data == "[DONE]" else json.loads(data))
    return events


def test_first_chunk_arrives_before_the_engine_finishes(
    streams: Streams, stream_gateway: Gateway
) -> None:
    num_tokens, token_delay_ms = 8, 150
    streams.client(stream_gateway)  # built outside the timed part
    started = time.monotonic()
    arrivals_s: list[float] = []
    text = ""
    for chunk in streams.open(stream_gateway, num_tokens, token_delay_ms=token_delay_ms):
        if chunk.choices and chunk.choices[0].delta.content:
            arrivals_s.append(time.monotonic() - started)
            text += chunk.choices[0].delta.content
    total_s = time.monotonic() - started

    assert text == " one two three one two three one two"
    assert total_s >= (num_tokens - 1) * token_delay_ms / 1000  # 1.05 s of engine delays
    assert arrivals_s[0] < 0.4
    # Tokens arrive one by one, spread over the whole stream, not in one burst at the end.
    assert arrivals_s[num_tokens // 2] < total_s - 0.3


@pytest.mark.parametrize("num_chunks_read", [
    pytest.param(1, id="after-first-chunk"),
    pytest.param(4, id="mid-stream"),
])
def test_client_disconnect_cancels_the_upstream(
    streams: Streams, stream_gateway: Gateway, stream_engine: Engine, num_chunks_read: int
) -> None:
    assert wait_until(lambda: stream_engine.stats()["in_flight"] == 0)
    before = stream_engine.stats()
    stream = streams.open(stream_gateway, max_tokens=40, token_delay_ms=100)
    chunks = [next(stream) for _ in range(num_chunks_read)]
    assert stream_engine.stats()["in_flight"] == 1
    disconnected_at = time.monotonic()

    stream.close()

    assert chunks[-1].choices[0].finish_reason is None
    assert wait_until(
        lambda: stream_engine.stats()["requests_cancelled"] == before["requests_cancelled"] + 1,
        timeout_s=2,
    )
    # Cancelled well before the 4 s the engine would have kept generating.
    assert time.monotonic() - disconnected_at < 1.5
    after = stream_engine.stats()
    assert after["in_flight"] == 0
    assert after["requests_completed"] == before["requests_completed"]
    streams.assert_serves(stream_gateway)


def test_upstream_dying_mid_stream_raises_in_the_sdk(
    streams: Streams, stream_gateway: Gateway, stream_engine: Engine
) -> None:
    aborted_before = stream_engine.stats()["requests_aborted"]
    # The token delay lets the first chunks reach the client before the engine dies.
    stream = streams.open(stream_gateway, 8, token_delay_ms=50, die_after_chunks=3)
    received = []
    with pytest.raises(openai.APIError) as caught:
        for chunk in stream:
            received.append(chunk)

    assert received and all(c.choices[0].finish_reason is None for c in received)
    assert "broke off the stream" in caught.value.message
    assert isinstance(caught.value.body, dict) and caught.value.body["code"] == "upstream_failed"
    assert stream.response.is_closed
    assert list(stream) == []
    assert stream_engine.stats()["requests_aborted"] == aborted_before + 1
    streams.assert_serves(stream_gateway)


@pytest.mark.parametrize(("gateway_name", "mock", "message"), [
    pytest.param("stream_gateway", {"token_delay_ms": 50, "die_after_chunks": 3},
                 "broke off the stream", id="engine-dies"),
    # The engine would take 7 s; the gateway gives up after the first 0.3 s gap.
    pytest.param("idle_gateway", {"token_delay_ms": 1000}, "stalled", id="idle-gap"),
])
def test_broken_stream_ends_with_an_error_event(
    request: pytest.FixtureRequest, streams: Streams, gateway_name: str, mock: dict[str, Any],
    message: str,
) -> None:
    gateway: Gateway = request.getfixturevalue(gateway_name)
    started = time.monotonic()

    events = raw_events(gateway, streams.key, 8, **mock)

    *chunks, last = events
    assert chunks and all("choices" in c for c in chunks)
    assert "[DONE]" not in events
    assert set(last) == {"error"} and message in last["error"]["message"]
    assert last["error"]["type"] == "upstream_error"
    assert time.monotonic() - started < 2.0
    streams.assert_serves(gateway)


def test_idle_gap_ends_the_sdk_stream_with_an_error(
    streams: Streams, idle_gateway: Gateway
) -> None:
    received = []
    with pytest.raises(openai.APIError) as caught:
        for chunk in streams.open(idle_gateway, 8, token_delay_ms=1000):
            received.append(chunk)

    assert received
    assert "stalled" in caught.value.message


def test_steady_stream_is_not_cut_by_the_idle_timeout(
    streams: Streams, idle_gateway: Gateway
) -> None:
    # Gaps of 0.15 s, each under the 0.3 s idle limit, over a stream longer than the limit.
    chunks = list(streams.open(idle_gateway, 6, token_delay_ms=150))
    assert chunks[-1].choices[0].finish_reason == "length"


def _raw_stream(gateway: Gateway, key: str, max_tokens: int, *, http_version: str,
                pause_s: float = 0.0) -> tuple[bytes, bytes]:
    """One chat stream over a plain socket with a 4 KiB receive buffer: the head and the raw
    body bytes (chunked framing, if any, left in). ``pause_s``: read nothing for that long
    after the head, so the gateway's writes back up."""
    import socket
    from urllib.parse import urlsplit

    parts = urlsplit(gateway.url)
    body = json.dumps({"model": MODEL, "messages": MESSAGES, "max_tokens": max_tokens,
                       "stream": True}).encode()
    head = (f"POST /v1/chat/completions HTTP/{http_version}\r\nHost: {parts.netloc}\r\n"
            f"Authorization: Bearer {key}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode()
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.settimeout(20)
        sock.connect((parts.hostname, parts.port))
        sock.sendall(head + body)
        received = bytearray()
        while b"\r\n\r\n" not in received:
            received += sock.recv(4096)
        time.sleep(pause_s)
        while data := sock.recv(65536):
            received += data
    response_head, _, raw = bytes(received).partition(b"\r\n\r\n")
    return response_head, raw


def _dechunk(raw: bytes) -> bytes:
    body = bytearray()
    while True:
        size_line, _, raw = raw.partition(b"\r\n")
        size = int(size_line, 16)
        if size == 0:
            assert raw == b"\r\n", "the last chunk must end the body"
            return bytes(body)
        body += raw[:size]
        assert raw[size:size + 2] == b"\r\n", "each chunk ends with CRLF"
        raw = raw[size + 2:]


def _sse_data(body: bytes) -> list[Any]:
    events = [event.removeprefix(b"data: ") for event in body.split(b"\n\n") if event]
    return [e.decode() if e == b"[DONE]" else json.loads(e) for e in events]


def test_a_slow_reader_gets_a_long_stream_whole(streams: Streams, stream_gateway: Gateway) -> None:
    # ~5 MB of events written by the engine at once, read by a client that first reads nothing
    # for 1 s through a 4 KiB buffer: the gateway must pause the engine and resume it, losing
    # and reordering nothing.
    max_tokens = 20_000
    head, raw = _raw_stream(stream_gateway, streams.key, max_tokens, http_version="1.1",
                            pause_s=1.0)

    assert head.startswith(b"HTTP/1.1 200")
    assert b"transfer-encoding: chunked" in head.lower()
    events = _sse_data(_dechunk(raw))
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert len(chunks) == max_tokens + 2  # the role, each token, the finish
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert len(raw) > 4_000_000
    streams.assert_serves(stream_gateway)


def test_an_http10_client_gets_the_stream_unchunked(
    streams: Streams, stream_gateway: Gateway
) -> None:
    head, raw = _raw_stream(stream_gateway, streams.key, 50, http_version="1.0")

    assert head.startswith(b"HTTP/1.0 200") or head.startswith(b"HTTP/1.1 200")
    assert b"transfer-encoding" not in head.lower()
    events = _sse_data(raw)  # the body is the events themselves, ended by the close
    assert events[-1] == "[DONE]"
    assert len(events) == 50 + 3


def test_a_client_that_stops_reading_is_cut_off_after_the_idle_timeout(
    streams: Streams, idle_gateway: Gateway
) -> None:
    # The engine writes ~5 MB at once; the client reads the head and then nothing. Once its
    # buffers are full the gateway pauses the engine and waits for the client to drain, for
    # the idle timeout (0.3 s here), then closes the connection instead of holding the
    # stream, its lease and its engine slot for as long as the client stays silent.
    import socket
    from urllib.parse import urlsplit

    parts = urlsplit(idle_gateway.url)
    body = json.dumps({"model": MODEL, "messages": MESSAGES, "max_tokens": 20_000,
                       "stream": True}).encode()
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: {parts.netloc}\r\n"
            f"Authorization: Bearer {streams.key}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode()
    received = bytearray()
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.settimeout(20)
        sock.connect((parts.hostname, parts.port))
        sock.sendall(head + body)
        while b"\r\n\r\n" not in received:
            received += sock.recv(4096)
        time.sleep(1.5)  # five idle timeouts without reading
        try:
            while data := sock.recv(65536):
                received += data
        except ConnectionResetError:
            pass  # the gateway aborted the connection

    assert received.startswith(b"HTTP/1.1 200")
    assert len(received) < 4_000_000  # cut off: the whole stream is over 5 MB
    assert not received.endswith(b"0\r\n\r\n")
    streams.assert_serves(idle_gateway)

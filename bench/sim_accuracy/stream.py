"""A lean HTTP/1.1 streaming client: one keep-alive connection, one SSE response at a time.

It parses only what the simulator sends back: the status line, then a chunked body whose
server-sent events it counts as they arrive (``data: `` never occurs in chunk framing), until
the last chunk ``0\\r\\n\\r\\n``. Arrival times are taken in ``data_received``, with no task
switch in between, and a read costs a few microseconds, so the load driver leaves the CPU to
the simulator it measures. Example::

    connection = await open_stream_connection("127.0.0.1", 19001)
    stream = await connection.stream("/v1/completions", body)
    stream.send_s, stream.first_event_s, stream.last_event_s, stream.num_events
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import cast

EVENT_MARK = b"data: "
LAST_CHUNK = b"\r\n0\r\n\r\n"  # the CRLF ending the previous chunk, then the zero-size chunk
HEAD_END = b"\r\n\r\n"


@dataclass(slots=True)
class StreamTimes:
    """One response, on the ``time.monotonic()`` clock."""

    send_s: float = 0.0
    first_event_s: float = 0.0
    last_event_s: float = 0.0
    num_events: int = 0


class StreamConnection(asyncio.Protocol):
    """See the module docstring; errors (status other than 200, a lost connection) raise."""

    def __init__(self, host: str, port: int) -> None:
        self._host_header = f"{host}:{port}".encode()
        self._transport: asyncio.Transport | None = None
        self._done: asyncio.Future[None] | None = None
        self._on_first_event: asyncio.Event | None = None
        self._times = StreamTimes()
        self._head = b""
        self._is_in_body = False
        self._tail = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's does not subclass it

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None
        self._fail(ConnectionError(f"the simulator closed the connection ({exc})"))

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()

    async def stream(self, path: str, body: bytes,
                     on_first_event: asyncio.Event | None = None) -> StreamTimes:
        """POST ``body`` to ``path`` and read the whole event stream; sets ``on_first_event``
        as soon as the first event is read."""
        if self._transport is None:
            raise ConnectionError("the connection is closed")
        self._done = asyncio.get_running_loop().create_future()
        self._on_first_event = on_first_event
        self._times = StreamTimes(send_s=time.monotonic())
        self._transport.write(
            b"POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (path.encode(), self._host_header, len(body), body))
        await self._done
        return self._times

    def data_received(self, data: bytes) -> None:
        now_s = time.monotonic()
        if not self._is_in_body:
            self._head += data
            end = self._head.find(HEAD_END)
            if end < 0:
                return
            head, data = self._head[:end], self._head[end + len(HEAD_END):]
            self._head = b""
            if not head.startswith(b"HTTP/1.1 200") or b"chunked" not in head.lower():
                self._fail(RuntimeError(f"unexpected response: {(head + data)[:500]!r}"))
                self.close()
                return
            self._is_in_body = True
            self._tail = b"\r\n"  # a body that is only the last chunk still ends with LAST_CHUNK
        window = self._tail + data
        # Marks that start in the tail were counted with the previous read.
        num_events = window.count(EVENT_MARK, max(0, len(self._tail) - len(EVENT_MARK) + 1))
        if num_events:
            times = self._times
            times.num_events += num_events
            times.last_event_s = now_s
            if not times.first_event_s:
                times.first_event_s = now_s
                if self._on_first_event is not None:
                    self._on_first_event.set()
        if window.endswith(LAST_CHUNK):
            self._is_in_body = False
            if self._done is not None and not self._done.done():
                self._done.set_result(None)
        self._tail = window[-len(LAST_CHUNK):]

    def _fail(self, exc: Exception) -> None:
        if self._done is not None and not self._done.done():
            self._done.set_exception(exc)


async def open_stream_connection(host: str, port: int) -> StreamConnection:
    loop = asyncio.get_running_loop()
    _, connection = await loop.create_connection(lambda: StreamConnection(host, port), host, port)
    return connection

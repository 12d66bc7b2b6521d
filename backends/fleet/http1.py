"""A lean HTTP/1.1 client for the gateway's hot path: keep-alive pools of asyncio protocols.

aiohttp's client costs ~150 CPU-µs per request on a 2-core VM (request and response objects,
its stream reader, cookie and trace hooks); a gateway in front of a fast engine spends more on
it than on everything else it does. This client does only what forwarding a completion needs:
one request per connection at a time, the head written in one ``write``, the response parsed
by httptools (llhttp, Node.js's parser), the body handed over as the chunks arrive.

- ``Pool``: the idle connections to one backend, most recently used first, and a bound on how
  many are open at once (busy or idle). A connection idle for ``IDLE_EXPIRY_S`` is closed
  instead of reused.
- ``Response``: status and headers once they arrived, then ``readany()`` / ``read()``. It
  detaches from its connection when its last byte arrives, and the connection goes back to the
  pool at once (its bytes are in the response's buffer by then). ``close()`` before that
  closes the connection: the engine sees the disconnect and stops generating.
- Flow control: a response whose unread buffer passes ``HIGH_WATER_BYTES`` pauses reading
  from the socket until the consumer catches up.
- Splicing: ``Response.splice(sink)`` hands the body to ``sink`` inside the connection's data
  callback, what each socket read brought in one piece, instead of buffering it and waking
  the reader. A relay that
  writes each chunk straight to its client this way costs no task switch per chunk; the
  reader then waits for the end with ``wait_spliced``. The sink asks for a pause by returning
  True (its client's buffer is full); reading stops until ``resume_reading``.

Complexity: O(1) per request and per chunk. Not supported: pipelining, HTTP/2, upgrades. A
body with neither a length nor chunks ends when the engine closes the connection (HTTP/1.0
style); such a connection is not reused.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import time
from collections import deque
from collections.abc import Callable
from urllib.parse import urlsplit

import httptools

HIGH_WATER_BYTES = 256 * 1024
# Engines behind uvicorn (vLLM, SGLang) close connections idle for 5 s, aiohttp servers after
# 75 s. A connection the engine closed while idle is seen (EOF) before reuse, unless the close
# crosses the request on the wire; that race is avoided by not reusing a connection idle for
# longer than the shortest common keep-alive. A request that broke is never sent again on the
# same engine: the engine may have been working on it (the gateway retries on another).
IDLE_EXPIRY_S = 4.0


class UpstreamBroken(Exception):
    """The connection broke, or the engine sent something that is not HTTP/1.1."""


class Response:
    """One upstream response: ``status`` and ``headers`` (lower-case names) once the head has
    arrived, then the body by ``readany`` (what has arrived, b"" at the end) or ``read``."""

    __slots__ = (
        "_chunks",
        "_conn",
        "_eof",
        "_error",
        "_sink",
        "_size",
        "_waiter",
        "content_type",
        "has_head",
        "headers",
        "num_bytes",
        "status",
    )

    def __init__(self, conn: Connection) -> None:
        self._conn: Connection | None = conn
        self._chunks: list[bytes] = []
        self._size = 0
        self._eof = False
        self._error: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._sink: Callable[[bytes], bool] | None = None
        self.has_head = False
        self.status = 0
        self.headers: dict[str, str] = {}
        self.content_type = ""
        self.num_bytes = 0  # bytes received, head included

    # -- the consumer ---------------------------------------------------------------------
    def is_eof(self) -> bool:
        """Every byte has arrived and been read."""
        return self._eof and not self._chunks

    @property
    def is_complete(self) -> bool:
        """Every byte has arrived (some may not have been read yet)."""
        return self._eof

    async def wait_head(self) -> None:
        while not self.has_head:
            if self._error is not None:
                raise self._error
            await self._wait()

    async def readany(self) -> bytes:
        """What has arrived since the last read; b"" once the body is over."""
        while True:
            if self._chunks:
                return self._take()
            if self._error is not None:
                raise self._error
            if self._eof:
                return b""
            await self._wait()

    async def read(self) -> bytes:
        """The rest of the body."""
        parts = []
        while chunk := await self.readany():
            parts.append(chunk)
        return b"".join(parts)

    def splice(self, sink: Callable[[bytes], bool]) -> None:
        """From now on hand the body to ``sink`` as it arrives, what each read brought in one
        piece (what has arrived unread goes first, from here). ``sink`` must not raise; it
        returns True to pause reading from the engine (see ``resume_reading``), which also
        wakes ``wait_spliced``."""
        self._sink = sink
        if self._chunks:
            self._flush()

    async def wait_spliced(self) -> None:
        """Wait until the body is over, or reading paused at the sink's request (see
        ``is_paused``), or the connection failed (raised)."""
        while not self._eof and not self.is_paused:
            if self._error is not None:
                raise self._error
            await self._wait()
        if self._error is not None:
            raise self._error

    @property
    def is_paused(self) -> bool:
        """Reading from the engine is paused until ``resume_reading``."""
        conn = self._conn
        return conn is not None and conn.is_paused

    def resume_reading(self) -> None:
        if self._conn is not None:
            self._conn.resume()

    def _flush(self) -> None:
        """Hand what has arrived to the sink, in one piece."""
        assert self._sink is not None
        if self._sink(self._take()):
            if self._conn is not None:
                self._conn.pause()
            self._wake()

    def close(self) -> None:
        """Done with it. Before its last byte arrived, this closes the connection."""
        conn = self._conn
        if conn is not None:
            self._conn = None
            conn.abort()
        self._chunks = []
        self._size = 0

    def _take(self) -> bytes:
        chunks = self._chunks
        data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        self._chunks = []
        if self._size > HIGH_WATER_BYTES and self._conn is not None:
            self._conn.resume()
        self._size = 0
        return data

    async def _wait(self) -> None:
        waiter = self._waiter = asyncio.get_running_loop().create_future()
        try:
            await waiter
        finally:
            self._waiter = None

    # -- the connection's side -------------------------------------------------------------
    def interrupt(self, error: BaseException) -> None:
        """Fail the response now with ``error``: a waiter (``wait_spliced``, ``read``) raises it.
        The connection is not reused (``close`` drops it, as for any unfinished response)."""
        self._fail(error)

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _fail(self, error: BaseException) -> None:
        if not self._eof and self._error is None:
            self._error = error
            self._conn = None
            self._wake()


class Connection(asyncio.Protocol):
    """One keep-alive connection to an engine; serves one request at a time."""

    def __init__(self, pool: Pool) -> None:
        self._pool = pool
        self._transport: asyncio.Transport | None = None
        self._parser = httptools.HttpResponseParser(self)
        self._response: Response | None = None
        self._raw_headers: list[tuple[bytes, bytes]] = []
        self._paused = False
        self._until_eof = False  # the body has neither a length nor chunks: it ends at EOF
        self.is_closed = False
        self.in_use = False
        self.idle_since = 0.0

    # -- the pool's side -------------------------------------------------------------------
    def send(self, head: bytes, body: bytes) -> Response:
        assert self._transport is not None and self._response is None
        response = self._response = Response(self)
        self._transport.write(head + body if len(body) < 16384 else head)
        if len(body) >= 16384:
            self._transport.write(body)
        return response

    def abort(self) -> None:
        """Close at once (the engine sees the disconnect); the pool forgets this connection."""
        if not self.is_closed:
            self.is_closed = True
            if self._transport is not None:
                self._transport.abort()
            self._pool.forget(self)
        response, self._response = self._response, None
        if response is not None:
            response._fail(UpstreamBroken("the connection was closed"))

    @property
    def is_paused(self) -> bool:
        return self._paused

    def pause(self) -> None:
        if not self._paused and self._transport is not None and not self.is_closed:
            self._paused = True
            self._transport.pause_reading()

    def resume(self) -> None:
        if self._paused and self._transport is not None and not self.is_closed:
            self._paused = False
            self._transport.resume_reading()

    # -- asyncio.Protocol ------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]  # uvloop's is no subclass

    def data_received(self, data: bytes) -> None:
        response = self._response
        if response is None:  # bytes nobody asked for: the connection cannot be trusted
            self.abort()
            return
        response.num_bytes += len(data)
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            response._fail(UpstreamBroken(f"malformed HTTP response ({exc})"))
            self.abort()
            return
        if response._sink is not None and response._chunks:
            response._flush()

    def connection_lost(self, exc: Exception | None) -> None:
        was_closed = self.is_closed
        self.is_closed = True
        self._transport = None
        response, self._response = self._response, None
        if response is not None:
            if self._until_eof and exc is None:
                response._eof = True
                response._conn = None
                response._wake()
            else:
                response._fail(UpstreamBroken("the engine closed the connection" if exc is None
                                              else f"connection lost ({exc})"))
        if not was_closed:
            self._pool.forget(self)

    # -- httptools callbacks ---------------------------------------------------------------
    def on_header(self, name: bytes, value: bytes) -> None:
        self._raw_headers.append((name, value))

    def on_headers_complete(self) -> None:
        response = self._response
        assert response is not None
        headers = response.headers
        for name, value in self._raw_headers:
            headers[name.decode("latin-1").lower()] = value.decode("latin-1")
        self._raw_headers = []
        response.status = status = self._parser.get_status_code()
        self._until_eof = ("content-length" not in headers and "chunked" not in
                           headers.get("transfer-encoding", "") and status >= 200
                           and status not in (204, 304))
        content_type = headers.get("content-type")
        if content_type is not None:
            response.content_type = content_type.partition(";")[0].strip().lower()
        response.has_head = True
        response._wake()

    def on_body(self, body: bytes) -> None:
        response = self._response
        assert response is not None
        response._chunks.append(body)
        response._size += len(body)
        if response._sink is not None:
            return  # handed over at the end of this read (data_received), in one piece
        if response._size > HIGH_WATER_BYTES:
            self.pause()
        response._wake()

    def on_message_complete(self) -> None:
        response, self._response = self._response, None
        assert response is not None
        if response._sink is not None and response._chunks:
            response._flush()
        response._eof = True
        response._conn = None
        response._wake()
        if self._parser.should_keep_alive() and not self.is_closed:
            self.resume()
            self._pool.release(self)
        else:
            self.abort()


class Pool:
    """The connections to one engine at ``base_url``: at most ``max_connections`` open."""

    def __init__(self, base_url: str, max_connections: int, connect_timeout_s: float) -> None:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {base_url!r}")
        self.host = parts.hostname
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self._ssl: ssl.SSLContext | None = (
            ssl.create_default_context() if parts.scheme == "https" else None)
        self._base_path = parts.path.rstrip("/")
        host_header = f"[{self.host}]" if ":" in self.host else self.host
        if parts.port is not None:
            host_header += f":{parts.port}"
        self._host_line = f"Host: {host_header}\r\n"
        self._connect_timeout_s = connect_timeout_s
        self._max_connections = max_connections
        self._num_taken = 0  # slots held: busy connections and ones being opened
        # Requests waiting for a slot, first come first served. Not an asyncio.Semaphore:
        # its acquire() costs ~6 µs per request in Python 3.11 (locked() scans the waiters).
        self._slot_waiters: deque[asyncio.Future[None]] = deque()
        self._idle: deque[Connection] = deque()  # oldest first
        self.num_open = 0

    @property
    def is_full(self) -> bool:
        """Every connection is busy: a request now waits for one to come back."""
        return self._num_taken >= self._max_connections  # Semaphore.locked() costs ~2 µs

    async def send(self, head: bytes, body: bytes) -> Response:
        """Write a request on a connection (pooled, else new); return its response. The caller
        awaits ``Response.wait_head``."""
        conn = await self.acquire()
        return conn.send(head, body)

    def head(self, path: str, length: int, headers: dict[str, str]) -> bytes:
        lines = [f"POST {self._base_path}{path} HTTP/1.1\r\n", self._host_line,
                 f"Content-Length: {length}\r\n"]
        for name, value in headers.items():
            if "\n" in value or "\r" in value or "\n" in name or "\r" in name:
                raise ValueError(f"header {name!r} holds a line break")
            lines.append(f"{name}: {value}\r\n")
        lines.append("\r\n")
        return "".join(lines).encode("utf-8", "surrogateescape")

    async def acquire(self) -> Connection:
        """The most recently used idle connection, else a new one."""
        if self._num_taken >= self._max_connections or self._slot_waiters:
            await self._wait_for_slot()  # counted taken by the release that woke it
        else:
            self._num_taken += 1
        try:
            now_s = time.monotonic()
            idle = self._idle
            while idle:
                conn = idle.pop()
                if conn.is_closed:
                    continue
                if now_s - conn.idle_since < IDLE_EXPIRY_S:
                    conn.in_use = True
                    return conn
                conn.abort()
            loop = asyncio.get_running_loop()
            async with asyncio.timeout(self._connect_timeout_s):
                _, conn = await loop.create_connection(
                    lambda: Connection(self), self.host, self.port, ssl=self._ssl,
                    server_hostname=self.host if self._ssl else None)
        except BaseException:
            self._release_slot()
            raise
        self.num_open += 1
        conn.in_use = True
        return conn

    def release(self, conn: Connection) -> None:
        """A connection whose response is complete: idle, ready for the next request."""
        if conn.in_use:
            conn.in_use = False
            self._release_slot()
        now_s = conn.idle_since = time.monotonic()
        idle = self._idle
        idle.append(conn)
        while idle and (idle[0].is_closed or now_s - idle[0].idle_since >= IDLE_EXPIRY_S):
            idle.popleft().abort()  # expired or already closed by the engine

    def forget(self, conn: Connection) -> None:
        """A connection that closed (busy or idle)."""
        self.num_open -= 1
        if conn.in_use:
            conn.in_use = False
            self._release_slot()

    async def _wait_for_slot(self) -> None:
        """Wait until a slot is handed to this request (first come, first served); one
        cancelled after it was handed its slot passes it on."""
        waiter = asyncio.get_running_loop().create_future()
        self._slot_waiters.append(waiter)
        try:
            await waiter
        except BaseException:
            if waiter.done() and not waiter.cancelled():
                self._release_slot()  # handed a slot, then cancelled: the next one takes it
            else:
                with contextlib.suppress(ValueError):
                    self._slot_waiters.remove(waiter)
            raise

    def _release_slot(self) -> None:
        self._num_taken -= 1
        self._wake_next()

    def _wake_next(self) -> None:
        """Hand a free slot to the first request waiting for one (it counts as taken)."""
        waiters = self._slot_waiters
        while waiters and self._num_taken < self._max_connections:
            waiter = waiters.popleft()
            if not waiter.done():
                self._num_taken += 1
                waiter.set_result(None)
                return

    def close(self) -> None:
        idle, self._idle = self._idle, deque()
        for conn in idle:
            conn.abort()

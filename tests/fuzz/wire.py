"""Sending fuzzed requests: with aiohttp's client, or as raw bytes over a socket.

``raw_cases`` draws what no HTTP client would send: a broken request line, control bytes in
a header, a line past the gateway's 16 KiB limit, contradictory or unparsable lengths, broken
chunked framing, a body cut short. ``send`` returns a ``Reply`` either way; ``None`` when the
gateway closed the connection without answering (allowed only for a request the client cut
short with a half-close).

Example::

    async with aiohttp.ClientSession() as session:
        reply = await send(session, "127.0.0.1", port, case)
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass

import aiohttp
import yarl
from hypothesis import strategies as st

from tests.fuzz.http_cases import Case, Credentials

REPLY_TIMEOUT_S = 30.0


@dataclass(frozen=True, slots=True)
class Reply:
    status: int
    headers: dict[str, str]  # lower-case names; the last value of a repeated header
    body: bytes


def _head(path: str, key: str, *lines: bytes) -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: gateway\r\nAuthorization: Bearer {key}\r\n"
            .encode() + b"".join(line + b"\r\n" for line in lines))


def raw_cases(creds: Credentials) -> st.SearchStrategy[Case]:
    chat = "/v1/chat/completions"
    body = b'{"model": "%s", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}' \
        % creds.models[0].encode()
    length = f"Content-Length: {len(body)}".encode()
    json = b"Content-Type: application/json"
    control = st.sampled_from((b"\x00", b"\r", b"\x7f", b"\x01", b"\xff", b"\x0b", b"\t"))
    requests = st.one_of(
        st.sampled_from((
            b"GARBAGE\r\n\r\n", b"GET / HTTP/9.9\r\n\r\n", b"GET\r\n\r\n", b" / HTTP/1.1\r\n\r\n",
            b"GET /healthz HTTP/1.0\r\n\r\n", b"GET /healthz HTTP/1.1\r\n\r\n",
            b"GET http://elsewhere/healthz HTTP/1.1\r\nHost: x\r\n\r\n",
            b"GET /" + b"a" * 20_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
            b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Long: " + b"b" * 20_000 + b"\r\n\r\n",
            b"GET /healthz HTTP/1.1\r\nHost: x\r\n folded\r\n\r\n",
            b"GET /healthz HTTP/1.1\r\nBad Header: x\r\n\r\n",
            b"GET /healthz HTTP/1.1\r\n: empty-name\r\n\r\n",
            b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\nGET /readyz HTTP/1.1\r\nHost: x\r\n\r\n",
            _head(chat, creds.tenant_key, json, b"Content-Length: abc", b"") + body,
            _head(chat, creds.tenant_key, json, b"Content-Length: -1", b"") + body,
            _head(chat, creds.tenant_key, json, length, b"Content-Length: 3", b"") + body,
            _head(chat, creds.tenant_key, json, length, b"Transfer-Encoding: chunked", b"")
            + body,
            _head(chat, creds.tenant_key, json, b"Transfer-Encoding: chunked", b"")
            + b"zz\r\n" + body + b"\r\n0\r\n\r\n",
            _head(chat, creds.tenant_key, json, b"Transfer-Encoding: chunked", b"")
            + b"%x\r\n%b\r\n0\r\n\r\n" % (len(body), body),
            _head(chat, creds.tenant_key, json, b"Transfer-Encoding: gzip, chunked", b"")
            + b"%x\r\n%b\r\n0\r\n\r\n" % (len(body), body),
        )),
        st.builds(lambda c: b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-A: a" + c + b"b\r\n\r\n",
                  control),
        st.builds(lambda c: _head(chat, creds.tenant_key, json, length,
                                  b"x-request-id: r" + c + b"q", b"") + body, control),
        st.builds(lambda junk: junk + b"\r\n\r\n", st.binary(min_size=1, max_size=40)),
    )
    # Cut short: the client half-closes before the body is complete.
    cut_short = st.sampled_from((
        _head(chat, creds.tenant_key, json, b"Content-Length: 1000", b"") + body,
        _head(chat, creds.tenant_key, json, length, b"") + body[:10],
        _head(chat, creds.tenant_key, json, b"Transfer-Encoding: chunked", b"") + b"ff\r\n{",
        b"GET /healthz HTTP/1.1\r\nHost: x\r\n",
    ))
    return st.one_of(
        requests.map(lambda raw: Case("raw", raw=raw, is_documented=False)),
        cut_short.map(lambda raw: Case(CUT_SHORT, raw=raw, is_documented=False)),
    )


CUT_SHORT = "raw, cut short"
RAW_REPLY_TIMEOUT_S = 5.0


async def send(session: aiohttp.ClientSession, host: str, port: int, case: Case) -> Reply | None:
    if case.raw is not None:
        return await _send_raw(host, port, case.raw, is_cut_short=case.operation == CUT_SHORT)
    # Absolute, and taken as encoded: a target like "//v1/models" stays a path.
    url = yarl.URL(f"http://{host}:{port}{case.target}", encoded=True)
    async with session.request(
        case.method, url, headers=list(case.headers),
        data=case.body if case.body or case.method in ("POST", "PATCH", "PUT") else None,
        allow_redirects=False, timeout=aiohttp.ClientTimeout(total=REPLY_TIMEOUT_S),
    ) as response:
        body = await response.read()
        headers = {k.lower(): v for k, v in response.headers.items()}
        return Reply(response.status, headers, body)


async def _send_raw(host: str, port: int, raw: bytes, *, is_cut_short: bool) -> Reply | None:
    """The reply to ``raw``; a request cut short is followed by a half-close (aiohttp then
    closes the connection, answered or not)."""
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(raw)
        with contextlib.suppress(ConnectionError):
            await writer.drain()
            if is_cut_short:
                writer.write_eof()
        async with asyncio.timeout(RAW_REPLY_TIMEOUT_S):
            return await _read_reply(reader)
    except (ValueError, IndexError, asyncio.IncompleteReadError) as exc:
        return Reply(-1, {}, f"unparsable reply: {exc!r}".encode())
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()


async def _read_reply(reader: asyncio.StreamReader) -> Reply | None:
    """The first response on the connection (a pipelined second one is not read)."""
    try:
        status_line = await reader.readline()
    except ConnectionError:
        return None
    if not status_line:
        return None
    status = int(status_line.split()[1])
    headers: dict[str, str] = {}
    while (line := await reader.readline()) not in (b"\r\n", b""):
        name, _, value = line.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    if "content-length" in headers:
        body = await reader.readexactly(int(headers["content-length"]))
    elif headers.get("transfer-encoding", "").lower() == "chunked":
        body = b""
        while size := int((await reader.readline()).split(b";")[0], 16):
            body += await reader.readexactly(size + 2)
            body = body[:-2]
    else:
        body = await reader.read()
    return Reply(status, headers, body)

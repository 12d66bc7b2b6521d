"""Reading an HTTP/1.1 answer off a raw socket, byte for byte: for tests that send what an HTTP
client would refuse to, or that check the answer's head as written."""

from __future__ import annotations

import socket


def read_answer(sock: socket.socket, buffered: bytes = b""
                ) -> tuple[str, dict[str, list[str]], bytes, bytes]:
    """One answer after ``buffered``: its status line, its headers (lower-cased names, each
    line checked to be ``Name: value``), its body by Content-Length, and what was read past
    it."""
    received = buffered
    while b"\r\n\r\n" not in received:
        chunk = sock.recv(65536)
        assert chunk, f"connection closed before an answer: {received!r}"
        received += chunk
    head, _, rest = received.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers: dict[str, list[str]] = {}
    for line in lines:
        name, sep, value = line.partition(":")
        assert sep and name == name.strip(), f"malformed header line {line!r}"
        headers.setdefault(name.lower(), []).append(value.strip())
    length = int(headers["content-length"][0])
    while len(rest) < length:
        chunk = sock.recv(65536)
        assert chunk, "connection closed inside the body"
        rest += chunk
    return status_line, headers, rest[:length], rest[length:]

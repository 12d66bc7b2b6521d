"""A round-robin TCP front for gateway replicas, on loopback only: the bench's stand-in for the
compose file's nginx.

Each accepted connection is piped, bytes unchanged, to the next replica in turn; a replica that
refuses the connection is skipped for the next one, so a replica being restarted costs no client
an error. Either side closing (or half-closing) closes both. It balances connections, not
requests: a client that opens one connection per request (``force_close``, as
`bench.replicas.drive` does) gets per-request round robin, as from nginx.
Bounded: at most ``max_connections`` client connections at once (later ones are closed at once),
and each side stops reading while the other side's write buffer is full. Run it in its own
process, so its CPU is its own::

    python -m bench.replicas.balancer --port 18080 --upstream 19101 --upstream 19102
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import signal
from collections.abc import Iterator, Sequence
from typing import cast

import uvloop

HOST = "127.0.0.1"
MAX_CONNECTIONS = 2048
_BUFFER_HIGH_BYTES = 1 << 20


class _Side(asyncio.Protocol):
    """One end of a pipe: what it reads is written to its peer; closing one closes both."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.peer: _Side | None = None
        self._pending: list[bytes] = []  # read before the peer was joined

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self.transport = cast(asyncio.Transport, transport)
        self.transport.set_write_buffer_limits(high=_BUFFER_HIGH_BYTES)

    def join(self, peer: _Side) -> None:
        """Pipe to ``peer`` from now on, starting with what was read so far."""
        self.peer = peer
        assert peer.transport is not None
        for chunk in self._pending:
            peer.transport.write(chunk)
        self._pending.clear()

    def _peer_transport(self) -> asyncio.Transport | None:
        return self.peer.transport if self.peer is not None else None

    def data_received(self, data: bytes) -> None:
        if (peer := self._peer_transport()) is None:
            self._pending.append(data)
        else:
            peer.write(data)

    def eof_received(self) -> bool:
        # Either side's EOF ends the pipe (the transport closes, then `connection_lost` closes
        # the peer after flushing it), as nginx drops the upstream connection when its client
        # leaves. Passing the half-close on instead would leave every connection open until
        # the gateway's keep-alive timeout: an HTTP server keeps a half-closed idle connection.
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        if (peer := self._peer_transport()) is not None:
            peer.close()

    # Flow control: while this side's socket cannot take more, stop reading the peer's.
    def pause_writing(self) -> None:
        if (peer := self._peer_transport()) is not None:
            peer.pause_reading()

    def resume_writing(self) -> None:
        if (peer := self._peer_transport()) is not None:
            peer.resume_reading()


class _ClientSide(_Side):
    """A client's connection: counted by its front, which connects it to a replica."""

    def __init__(self, front: RoundRobinFront) -> None:
        super().__init__()
        self._front = front

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        if not self._front.admit():
            transport.close()
            return
        assert self.transport is not None
        self.transport.pause_reading()  # until a replica is connected
        asyncio.get_running_loop().create_task(self._front.connect(self))

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        self._front.release()


class RoundRobinFront:
    """Accepts on ``HOST:port`` and pipes each connection to the next of ``upstream_ports``.

    Example::

        front = RoundRobinFront([19101, 19102])
        server = await loop.create_server(front.client_side, HOST, 18080)
    """

    def __init__(self, upstream_ports: Sequence[int],
                 max_connections: int = MAX_CONNECTIONS) -> None:
        if not upstream_ports:
            raise ValueError("a front needs at least one upstream")
        self._ports = list(upstream_ports)
        self._turns: Iterator[int] = itertools.cycle(range(len(self._ports)))
        self._max_connections = max_connections
        self.num_open = 0
        self.num_refused = 0

    def client_side(self) -> _Side:
        return _ClientSide(self)

    def admit(self) -> bool:
        """Count a new client connection; False (refused) when `max_connections` are open."""
        if self.num_open >= self._max_connections:
            self.num_refused += 1
            return False
        self.num_open += 1
        return True

    def release(self) -> None:
        self.num_open -= 1

    def upstream_order(self) -> list[int]:
        """The replicas' ports to try for the next connection: its turn's first."""
        first = next(self._turns)
        return [self._ports[(first + i) % len(self._ports)] for i in range(len(self._ports))]

    async def connect(self, client: _Side) -> None:
        """Join ``client`` to the first replica of its turn that accepts; close it if none."""
        loop = asyncio.get_running_loop()
        assert client.transport is not None
        for port in self.upstream_order():
            try:
                transport, upstream = await loop.create_connection(_Side, HOST, port)
            except OSError:
                continue
            if client.transport.is_closing():  # the client left while we connected
                transport.close()
                return
            upstream.join(client)
            client.join(upstream)
            client.transport.resume_reading()
            return
        client.transport.close()


async def serve(port: int, upstream_ports: Sequence[int]) -> None:
    """Serve until SIGTERM or SIGINT."""
    loop = asyncio.get_running_loop()
    front = RoundRobinFront(upstream_ports)
    server = await loop.create_server(front.client_side, HOST, port, backlog=1024)
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    async with server:
        await stop.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.replicas.balancer",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=int, required=True, help=f"listen on {HOST}:PORT")
    parser.add_argument("--upstream", type=int, action="append", required=True,
                        help=f"a replica's port on {HOST} (repeat, in round-robin order)")
    args = parser.parse_args(argv)
    uvloop.run(serve(args.port, args.upstream))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

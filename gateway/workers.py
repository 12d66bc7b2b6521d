"""``switchyard serve --workers N``: N gateway processes on one port, each a replica.

One gateway process runs one event loop, so it uses one core. With ``listen.workers`` (or
``--workers``) above 1, ``serve`` becomes a supervisor: it reserves the port (a socket bound
with ``SO_REUSEPORT`` that never listens), starts N worker processes that each bind the same
port with ``SO_REUSEPORT`` (the kernel spreads new connections over them), and shares nothing
else with them: the workers share tenants, keys, quotas, the approximate prefix index and the
fleet's state through Redis exactly as separate replicas do, so ``state: memory`` is refused.

The supervisor prints one ready line once every worker listens, forwards ``SIGHUP`` (reload)
to each, restarts a worker that dies (with backoff), and on ``SIGTERM`` or ``SIGINT`` has every
worker drain at once (each stops accepting, finishes what it carries within
``drain_timeout_s``) before it exits. Each worker dies with the supervisor, even a killed one.
``POST /admin/reload`` on any worker reloads them all (it asks the supervisor to forward a
``SIGHUP``). ``GET /metrics`` on any worker reports every worker's series, each with a
``worker`` label (``gateway.observe.worker_metrics``).

Example::

    switchyard serve --config gateway.yaml --workers 4
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import shutil
import signal
import socket
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

from gateway.cli.localproc import die_with_parent
from gateway.settings import ConfigError, Settings, load_settings

log = logging.getLogger(__name__)
READY_PREFIX = b"switchyard gateway listening on "
SUPERVISOR_PID_VARIABLE = "SWITCHYARD_SUPERVISOR_PID"  # set in each worker's environment
START_TIMEOUT_S = 120.0
MAX_RESTART_DELAY_S = 30.0
STOP_MARGIN_S = 10.0  # beyond drain_timeout_s, before a worker that will not stop is killed


def reserve_port(host: str, port: int) -> socket.socket:
    """A socket bound to ``host:port`` with ``SO_REUSEPORT`` that never listens: it holds the
    port (and learns it, for port 0) while the workers bind it too."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    return sock


def refusal(settings: Settings) -> str | None:
    """Why these settings cannot run several workers, or None."""
    if settings.state == "memory":
        return ("listen.workers > 1 needs 'state: redis': each worker is a replica, and "
                "replicas share tenants, keys and quotas only through Redis")
    return None


@dataclass(frozen=True, slots=True)
class WorkerRole:
    """What a worker process is told by its supervisor: its index, the port it shares, how
    many workers there are and where their metrics sockets are."""

    index: int
    port: int
    num_workers: int
    socket_dir: Path


WORKER_ROLE = web.AppKey("worker_role", WorkerRole)


@dataclass(slots=True)
class _Worker:
    index: int
    process: asyncio.subprocess.Process | None = None
    is_ready: asyncio.Event = field(default_factory=asyncio.Event)
    num_restarts: int = 0


class Supervisor:
    """Runs ``num_workers`` worker processes on ``port`` until signalled."""

    def __init__(self, settings: Settings, config_path: Path | None, port: int,
                 socket_dir: Path) -> None:
        self.settings = settings
        self.config_path = config_path
        self.port = port
        self.socket_dir = socket_dir
        self.workers = [_Worker(i) for i in range(settings.listen.workers)]
        self.is_stopping = False
        self.has_failed = False
        self._stopped = asyncio.Event()

    def _argv(self, index: int) -> list[str]:
        argv = [sys.executable, "-m", "gateway.workers", "--index", str(index),
                "--port", str(self.port), "--workers", str(len(self.workers)),
                "--socket-dir", str(self.socket_dir)]
        return argv + (["--config", str(self.config_path)] if self.config_path else [])

    async def _start(self, worker: _Worker) -> None:
        env = {**os.environ, SUPERVISOR_PID_VARIABLE: str(os.getpid())}
        worker.is_ready.clear()
        worker.process = await asyncio.create_subprocess_exec(
            *self._argv(worker.index), stdout=asyncio.subprocess.PIPE, env=env,
            preexec_fn=die_with_parent)
        asyncio.get_running_loop().create_task(self._follow(worker, worker.process))

    async def _follow(self, worker: _Worker, process: asyncio.subprocess.Process) -> None:
        """Pass the worker's output on (its own ready line is the supervisor's cue, not
        printed), and restart it when it dies while the supervisor is not stopping."""
        assert process.stdout is not None
        while line := await process.stdout.readline():
            if line.startswith(READY_PREFIX):
                worker.is_ready.set()
            else:
                sys.stdout.buffer.write(line)
                sys.stdout.flush()
        code = await process.wait()
        if self.is_stopping:
            return
        if code == 2 and not worker.is_ready.is_set():  # its configuration: no use retrying
            log.error("gateway worker %d could not start (exit 2); stopping", worker.index)
            self.has_failed = True
            self._stopped.set()
            return
        delay_s = min(MAX_RESTART_DELAY_S, 0.5 * 2 ** min(worker.num_restarts, 6))
        log.error("gateway worker %d exited with %s; restarting it in %.1f s", worker.index,
                  code, delay_s)
        worker.num_restarts += 1
        await asyncio.sleep(delay_s)
        if not self.is_stopping:
            await self._start(worker)

    def forward(self, signum: int) -> None:
        for worker in self.workers:
            if worker.process is not None and worker.process.returncode is None:
                worker.process.send_signal(signum)

    async def run(self, host: str) -> int:
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, self._stopped.set)
        loop.add_signal_handler(signal.SIGHUP, self.forward, signal.SIGHUP)
        for worker in self.workers:
            await self._start(worker)
        ready: asyncio.Future[Any] = asyncio.gather(*(w.is_ready.wait() for w in self.workers))
        stopped: asyncio.Future[Any] = loop.create_task(self._stopped.wait())
        done, _ = await asyncio.wait((ready, stopped), timeout=START_TIMEOUT_S,
                                     return_when=asyncio.FIRST_COMPLETED)
        if ready in done:
            url_host = f"[{host}]" if ":" in host else host
            print(f"switchyard gateway listening on http://{url_host}:{self.port} "
                  f"({len(self.workers)} workers)", flush=True)
            await stopped
        else:
            ready.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await ready
            if stopped not in done:
                log.error("the gateway workers were not all listening after %.0f s",
                          START_TIMEOUT_S)
                self.has_failed = True
        return await self.stop()

    async def stop(self) -> int:
        """Every worker drains at once; one that outlasts its drain time is killed."""
        self.is_stopping = True
        self.forward(signal.SIGTERM)
        deadline_s = time.monotonic() + self.settings.drain_timeout_s + STOP_MARGIN_S
        code = 2 if self.has_failed else 0
        for worker in self.workers:
            process = worker.process
            if process is None:
                continue
            try:
                async with asyncio.timeout(max(0.1, deadline_s - time.monotonic())):
                    await process.wait()
            except TimeoutError:
                log.error("gateway worker %d did not stop in time; killing it", worker.index)
                process.kill()
                await process.wait()
                code = 1
        log.info("gateway workers stopped")
        return code


def supervise(settings: Settings, config_path: Path | None) -> int:
    """``serve`` with several workers; returns the exit status."""
    logging.basicConfig(level=settings.log_level.upper(),
                        format="%(asctime)s %(levelname)s supervisor %(name)s: %(message)s")
    why = refusal(settings)
    if why is not None:
        print(f"switchyard serve: {why}", file=sys.stderr)
        return 2
    host = settings.listen.host
    reserved = reserve_port(host, settings.listen.port)
    socket_dir = Path(tempfile.mkdtemp(prefix="switchyard-workers-"))
    try:
        port = reserved.getsockname()[1]
        supervisor = Supervisor(settings, config_path, port, socket_dir)
        return asyncio.run(supervisor.run(host))
    finally:
        reserved.close()
        shutil.rmtree(socket_dir, ignore_errors=True)


def ask_supervisor_to_reload() -> bool:
    """In a worker: have the supervisor forward a reload to every worker (this one included);
    False when this process has no supervisor."""
    pid = os.environ.get(SUPERVISOR_PID_VARIABLE)
    if not pid or int(pid) != os.getppid():
        return False
    os.kill(int(pid), signal.SIGHUP)
    return True


def worker_main(argv: list[str] | None = None) -> int:
    """One worker: the gateway on the supervisor's port, with ``SO_REUSEPORT``."""
    parser = argparse.ArgumentParser(prog="python -m gateway.workers")
    parser.add_argument("--index", type=int, required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--workers", type=int, required=True)
    parser.add_argument("--socket-dir", type=Path, required=True)
    parser.add_argument("--config")
    args = parser.parse_args(argv)
    try:
        settings = load_settings(args.config)
    except ConfigError as exc:
        print(f"gateway worker {args.index}: {exc}", file=sys.stderr)
        return 2
    from gateway.server import serve

    # The settings stay the file's (a reload compares file with file); the role says where
    # this worker listens.
    serve(settings, config_path=Path(args.config) if args.config else None,
          worker=WorkerRole(args.index, args.port, args.workers, args.socket_dir))
    return 0


if __name__ == "__main__":
    sys.exit(worker_main())

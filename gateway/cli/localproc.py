"""Child processes for a local fleet: a private redis-server, engines, gateways.

Used by ``switchyard up``, the test suite and the benchmarks, so all three start things the same
way. Example::

    with ProcessGroup() as group:
        redis_url = start_redis(group, workdir)
        group.spawn("engine", [sys.executable, "-m", "backends.mock", "--port", "19001"])
        wait_http("http://127.0.0.1:19001/health")
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType

import httpx


def die_with_parent() -> None:
    """In the child, before exec: get SIGTERM if the parent dies, even by SIGKILL (Linux), so
    a killed ``switchyard up`` or test run never leaves orphans holding ports."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


# Listeners' ports come from here: below the Redis Cluster nodes' (`_cluster_port`: 12,000 up,
# their bus ports 22,000 up) and the kernel's ephemeral range (32,768 up by default), from which
# every outgoing connection takes its port. A port the kernel picked for a listener (bind to 0)
# is in that range, and a client connection could take it before the listener's own process
# bound it (a gateway that died with "Address already in use" in a busy test run). Each process
# walks the range from a random start, so it never hands out a port twice before the listener
# had time to bind it, and two processes (the test suite's workers) walk far apart.
LISTEN_PORTS = range(2_000, 12_000)
_walk = {"next": random.randrange(LISTEN_PORTS.start, LISTEN_PORTS.stop)}
_walk_lock = threading.Lock()


def free_port(host: str = "127.0.0.1", attempts: int = 200) -> int:
    """A port free on ``host`` right now, from `LISTEN_PORTS`."""
    return free_port_range(1, host, attempts)


def _next_base(count: int) -> int:
    with _walk_lock:
        base = _walk["next"]
        if base + count > LISTEN_PORTS.stop:
            base = LISTEN_PORTS.start
        _walk["next"] = base + count
        return base


def free_port_range(count: int, host: str = "127.0.0.1", attempts: int = 200) -> int:
    """A base port such that ``base .. base + count - 1`` are all free right now, all in
    `LISTEN_PORTS`, and none handed out by this process lately."""
    if not 1 <= count <= len(LISTEN_PORTS):
        raise ValueError(f"count must be 1 to {len(LISTEN_PORTS)}, not {count}")
    for _ in range(attempts):
        base = _next_base(count)
        socks = []
        try:
            for port in range(base, base + count):
                sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                socks.append(sock)
                sock.bind((host, port))
            return base
        except OSError:
            continue
        finally:
            for sock in socks:
                sock.close()
    raise RuntimeError(f"no {count} consecutive free ports on {host} between "
                       f"{LISTEN_PORTS.start} and {LISTEN_PORTS.stop}")


class ProcessGroup:
    """Children started in order and stopped in reverse: SIGTERM, then SIGKILL after a grace."""

    def __init__(self, log_dir: Path | None = None) -> None:
        self.children: list[tuple[str, subprocess.Popen[bytes]]] = []
        self._log_dir = log_dir

    def spawn(self, name: str, argv: Sequence[str], env: dict[str, str] | None = None,
              quiet: bool = True) -> subprocess.Popen[bytes]:
        stdout: int | None = None
        if self._log_dir is not None:
            log_path = self._log_dir / f"{name}.log"
            stdout = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        elif quiet:
            stdout = subprocess.DEVNULL
        full_env = {**os.environ, **(env or {})}
        child = subprocess.Popen(
            list(argv), stdout=stdout, stderr=subprocess.STDOUT if stdout is not None else None,
            env=full_env, preexec_fn=die_with_parent,
        )
        if stdout not in (None, subprocess.DEVNULL):
            os.close(stdout)
        self.children.append((name, child))
        return child

    def dead_child(self, *, is_clean_exit_ok: bool = True) -> str | None:
        """A child that has exited; by default only a failed one (non-zero status), since a
        test may stop a child on purpose."""
        for name, child in self.children:
            if child.poll() is not None and (child.returncode != 0 or not is_clean_exit_ok):
                return f"{name} (exit status {child.returncode})"
        return None

    def stop_all(self, grace_s: float = 10.0) -> None:
        for _, child in reversed(self.children):
            if child.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    child.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + grace_s
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.wait(timeout=max(0.1, deadline - time.monotonic()))
            if child.poll() is None:
                child.kill()
                child.wait()
        self.children.clear()

    def __enter__(self) -> ProcessGroup:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop_all()


def redis_server_path() -> str:
    path = shutil.which("redis-server") or (
        "/usr/bin/redis-server" if Path("/usr/bin/redis-server").exists() else None
    )
    if path is None:
        raise RuntimeError(
            "redis-server is not installed: run 'apt-get install -y redis-server' "
            "(scripts/setup.sh does) or pass --redis-url"
        )
    return path


def start_redis(group: ProcessGroup, workdir: Path, port: int | None = None,
                extra: Sequence[str] = ()) -> str:
    """Start a private, memory-only redis-server on loopback; return its URL once it answers.
    ``extra`` adds command-line options."""
    port = port or free_port()
    argv = [
        redis_server_path(), "--port", str(port), "--bind", "127.0.0.1",
        "--save", "", "--appendonly", "no", "--dir", str(workdir),
        "--protected-mode", "yes", "--loglevel", "warning", *extra,
    ]
    group.spawn(f"redis-{port}", argv)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2) as s:
            s.sendall(b"PING\r\n")
            if s.recv(64).startswith(b"+PONG"):
                return f"redis://127.0.0.1:{port}/0"
        time.sleep(0.05)
    raise RuntimeError(f"redis-server did not start on port {port}")


def start_redis_cluster(group: ProcessGroup, workdir: Path, primaries: int = 3,
                        replicas: int = 0, node_timeout_ms: int = 1000) -> tuple[str, list[int]]:
    """Start a private Redis Cluster on loopback: ``primaries`` nodes sharing the 16,384 slots,
    each with ``replicas`` replicas, joined by ``redis-cli --cluster create``. Returns its
    ``redis+cluster://`` URL (every node listed) and the nodes' ports, primaries first."""
    ports = [_cluster_port() for _ in range(primaries * (1 + replicas))]
    for port in ports:
        start_redis(group, workdir, port, extra=[
            "--cluster-enabled", "yes", "--cluster-config-file", f"nodes-{port}.conf",
            "--cluster-node-timeout", str(node_timeout_ms), "--repl-diskless-sync-delay", "0"])
    cli = shutil.which("redis-cli") or "/usr/bin/redis-cli"
    created = subprocess.run(
        [cli, "--cluster", "create", *(f"127.0.0.1:{p}" for p in ports),
         "--cluster-replicas", str(replicas), "--cluster-yes"],
        capture_output=True, text=True, timeout=60, check=False)
    if created.returncode != 0:
        raise RuntimeError(f"redis-cli --cluster create failed: {created.stdout[-2000:]}"
                           f"{created.stderr[-2000:]}")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        # Ready when every node serves every slot and every replica holds its primary's data
        # (a replica that never synced cannot be promoted).
        states = [_node_info(port, "CLUSTER INFO", "cluster_state") for port in ports]
        links = [_node_info(port, "INFO replication", "master_link_status") for port in ports]
        if all(s == "ok" for s in states) and links.count("up") == primaries * replicas:
            return "redis+cluster://" + ",".join(f"127.0.0.1:{p}" for p in ports), ports
        time.sleep(0.1)
    raise RuntimeError(f"the Redis Cluster on ports {ports} did not become ready")


def _cluster_port(attempts: int = 200) -> int:
    """A free port for a cluster node whose bus port (10,000 above) is free too; both below
    the kernel's ephemeral range (32768 up), so no client connection takes them meanwhile."""
    for _ in range(attempts):
        port = random.randrange(12_000, 22_000)
        try:
            with socket.socket() as first, socket.socket() as second:
                first.bind(("127.0.0.1", port))
                second.bind(("127.0.0.1", port + 10_000))
            return port
        except OSError:
            continue
    raise RuntimeError("no free port pair for a Redis Cluster node between 12000 and 32000")


def _node_info(port: int, command: str, field: str) -> str:
    """One ``field:value`` of a Redis node's INFO-like reply to ``command``, or ``""``."""
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5) as s:
        s.sendall(command.encode() + b"\r\n")
        reply = s.recv(8192).decode("ascii", "replace")
        for line in reply.splitlines():
            if line.startswith(field + ":"):
                return line.partition(":")[2].strip()
    return ""


class Stopped(Exception):
    """A stop was asked for (``is_stopped()``) while waiting for a child."""


def wait_http(url: str, timeout_s: float = 20.0, group: ProcessGroup | None = None, *,
              is_stopped: Callable[[], bool] | None = None, is_clean_exit_ok: bool = True,
              poll_s: float = 0.05, request_timeout_s: float = 1.0) -> None:
    """Poll ``url`` until it answers 200; fail early if a child of ``group`` died (with
    ``is_clean_exit_ok`` only a failed one, see `ProcessGroup.dead_child`), and raise `Stopped`
    as soon as ``is_stopped()``."""
    deadline = time.monotonic() + timeout_s
    last = "no answer"
    while time.monotonic() < deadline:
        if is_stopped is not None and is_stopped():
            raise Stopped
        if group is not None and (dead := group.dead_child(is_clean_exit_ok=is_clean_exit_ok)):
            raise RuntimeError(f"{dead} exited while waiting for {url}")
        try:
            response = httpx.get(url, timeout=request_timeout_s)
            if response.status_code == 200:
                return
            last = f"HTTP {response.status_code}: {response.text[:200]}"
        except httpx.HTTPError as exc:
            last = str(exc) or exc.__class__.__name__
        time.sleep(poll_s)
    raise RuntimeError(f"{url} not ready after {timeout_s:g} s ({last})")


def python_module_argv(module: str, *args: str) -> list[str]:
    return [sys.executable, "-m", module, *args]

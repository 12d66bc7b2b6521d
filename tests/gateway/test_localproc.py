"""Local child processes never outlive a parent that was killed (no orphans holding ports), and
the ports they listen on are handed out where no client connection takes them."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gateway.cli.localproc import LISTEN_PORTS, free_port, free_port_range

PARENT = """
import sys, time
from gateway.cli.localproc import ProcessGroup
group = ProcessGroup()
child = group.spawn("sleeper", [sys.executable, "-c", "import time; time.sleep(60)"])
print(child.pid, flush=True)
time.sleep(60)
"""


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_children_die_when_the_parent_is_killed() -> None:
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True,
                              cwd=Path(__file__).resolve().parents[2])
    assert parent.stdout is not None
    child_pid = int(parent.stdout.readline())
    assert _alive(child_pid)
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and _alive(child_pid):
        time.sleep(0.05)
    assert not _alive(child_pid)


def test_free_ports_come_from_below_the_ephemeral_range_and_never_twice_in_a_row() -> None:
    ports = [free_port() for _ in range(50)]
    assert all(port in LISTEN_PORTS for port in ports)
    assert len(set(ports)) == 50  # handed out in turn, not drawn again while still unbound
    ephemeral_low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    assert LISTEN_PORTS.stop <= ephemeral_low
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", ports[-1] + 1))  # the next in turn is busy: skipped
        base = free_port_range(3)
        assert not base <= ports[-1] + 1 < base + 3
        for port in range(base, base + 3):
            with socket.socket() as sock:
                sock.bind(("127.0.0.1", port))


def test_a_range_larger_than_the_listen_ports_is_refused() -> None:
    with pytest.raises(ValueError, match="count must be"):
        free_port_range(len(LISTEN_PORTS) + 1)

"""The fleet a fault scenario runs on: a private Redis, one ``backends.sim`` process per
worker (so that one can be killed or stopped alone), optionally the misbehaving engine of the
fault tests (``tests.faulty_engine``), and one gateway with default settings.

**own**: the workers heartbeat through Redis and the gateway lists no backend but the faulty
engine; **third-party**: the same workers without Redis, listed in ``backends:`` with
``routing: {discover_workers: false}`` (`bench.common.fleet_modes`). Example::

    with FaultFleet(workdir, "own") as fleet:
        workers = fleet.start_workers(3)
        gateway = fleet.start_fault_gateway(workers, faulty_url=None)
        key = fleet.provision(gateway, limits=None)
        os.kill(workers[0].pid, signal.SIGSTOP)
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from bench.common.fleet_modes import Mode, fleet_snapshot, static_backends, wait_for_backends
from gateway.cli.localfleet import SIM_MODEL, GatewayProc, LocalFleet, admin_client, create_tenant
from gateway.cli.localproc import (
    free_port,
    free_port_range,
    python_module_argv,
    start_redis,
    wait_http,
)

TENANT_ID = "fault-bench"
# Slowed down four times, so a 32-token stream lasts about a second and a fault meets
# streams mid-way; heartbeats at the workers' default interval (1 s), as `switchyard up`.
SIM_FLAGS = ("--speed-factor", "0.25")


@dataclass(frozen=True, slots=True)
class Worker:
    name: str  # the name the gateway knows it by: sim-PORT in both modes
    url: str
    process: subprocess.Popen[bytes]

    @property
    def pid(self) -> int:
        return self.process.pid


class FaultFleet(LocalFleet):
    """A `LocalFleet` whose workers each run in their own process; on exit every stopped
    child is continued first, so that stopping them all takes no grace period."""

    def __init__(self, workdir: Path, mode: Mode) -> None:
        super().__init__(workdir, grace_s=5)
        self.mode = mode
        self.workers: list[Worker] = []
        self.faulty_url: str | None = None
        self._tenant: dict[str, Any] = {}

    def __exit__(self, *exc: Any) -> None:
        for _, child in self.group.children:
            if child.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(child.pid, signal.SIGCONT)
        super().__exit__(*exc)

    def start_workers(self, count: int) -> list[Worker]:
        for _ in range(count):
            port = free_port_range(1)
            argv = ["--workers", "1", "--base-port", str(port), "--model", SIM_MODEL,
                    "--tokenizer", "approx", *SIM_FLAGS]
            if self.mode == "own":
                argv += ["--redis-url", self.redis_url]
            process = self.group.spawn(f"sim-{port}", python_module_argv("backends.sim", *argv))
            self.workers.append(Worker(f"sim-{port}", f"http://127.0.0.1:{port}", process))
        self.wait_healthy([w.url for w in self.workers], timeout_s=30)
        return self.workers

    def start_faulty(self) -> str:
        """The engine of the fault tests, answering correctly until told otherwise."""
        port = free_port()
        self.group.spawn("faulty", python_module_argv(
            "tests.faulty_engine", "--port", str(port), "--model", SIM_MODEL))
        self.faulty_url = f"http://127.0.0.1:{port}"
        wait_http(self.faulty_url + "/health", timeout_s=20, group=self.group)
        return self.faulty_url

    def set_fault(self, mode: str) -> int:
        """Switch the faulty engine to ``mode``; the completion requests it had so far."""
        assert self.faulty_url is not None
        response = httpx.post(self.faulty_url + "/fault", json={"mode": mode}, timeout=5)
        response.raise_for_status()
        return int(response.json()["num_requests"])

    def faulty_requests(self) -> int:
        assert self.faulty_url is not None
        return int(httpx.get(self.faulty_url + "/fault", timeout=5).json()["num_requests"])

    def start_fault_gateway(self) -> GatewayProc:
        """A gateway with default settings (log level warning) on this fleet, once every
        worker is ready in this mode and the faulty engine, if any, is healthy."""
        listed = ([{"name": "faulty", "url": self.faulty_url, "models": [SIM_MODEL]}]
                  if self.faulty_url else [])
        settings: dict[str, Any] = {"log_level": "warning"}
        if self.mode == "own":
            settings["backends"] = listed
        else:
            settings["backends"] = [*static_backends([w.url for w in self.workers], SIM_MODEL),
                                    *listed]
            settings["routing"] = {"discover_workers": False}
        gateway = self.start_gateway(settings, ready_timeout_s=30)
        wait_for_backends(gateway.url, self.admin_token, len(self.workers), self.mode,
                          self.group)
        deadline = time.monotonic() + 20
        while self.faulty_url and time.monotonic() < deadline:
            faulty = [b for b in fleet_snapshot(gateway.url, self.admin_token)
                      if b["url"] == self.faulty_url]
            if faulty and faulty[0]["is_healthy"]:
                break
            time.sleep(0.1)
        return gateway

    def provision(self, gateway: GatewayProc, limits: dict[str, int] | None) -> str:
        """The bench tenant (with ``limits``) and a key of it, used once so the gateway has it
        cached; the key's plaintext."""
        self._tenant = {"id": TENANT_ID, "name": TENANT_ID, **({"limits": limits} if limits
                                                                  else {})}
        key = self.create_tenant_key(gateway.url, self._tenant)
        response = httpx.post(gateway.url + "/v1/chat/completions", timeout=30,
                              headers={"Authorization": f"Bearer {key}"},
                              json={"model": SIM_MODEL, "max_tokens": 2,
                                    "messages": [{"role": "user", "content": "warm-up"}]})
        if response.status_code != 200:
            raise RuntimeError(f"the warm-up request failed: {response.status_code} "
                               f"{response.text[:300]}")
        return key

    def reprovision(self, gateway: GatewayProc, key: str, timeout_s: float = 5.0) -> float:
        """Make the tenant and import the same key again (after Redis came back empty); the
        monotonic time it was done."""
        deadline = time.monotonic() + timeout_s
        last = ""
        while time.monotonic() < deadline:
            try:
                with admin_client(gateway.url, self.admin_token) as admin:
                    create_tenant(admin, self._tenant, is_existing_ok=True)
                    made = admin.post("/admin/keys/import",
                                      json={"tenant_id": TENANT_ID, "key": key})
                if made.status_code in (201, 409):
                    return time.monotonic()
                last = f"{made.status_code} {made.text[:200]}"
            except (httpx.HTTPError, RuntimeError) as exc:
                last = str(exc)
            time.sleep(0.05)
        raise RuntimeError(f"could not make the tenant and key again: {last}")

    # -- Redis ------------------------------------------------------------------------------
    @property
    def redis_process(self) -> subprocess.Popen[bytes]:
        return [child for name, child in self.group.children
                if name.startswith("redis-") and child.poll() is None][-1]

    @property
    def redis_port(self) -> int:
        return int(self.redis_url.rsplit(":", 1)[1].split("/")[0])

    def restart_redis(self) -> tuple[float, float]:
        """kill -9 Redis and start an empty one on the same port; (killed, answering) times."""
        process = self.redis_process
        process.kill()
        killed_s = time.monotonic()
        process.wait()
        start_redis(self.group, self.workdir, port=self.redis_port)
        return killed_s, time.monotonic()

    def import_roots(self) -> dict[str, Any]:
        """Where the children import the project from: their PYTHONPATH and working folder."""
        roots: dict[str, Any] = {}
        for name, child in self.group.children:
            if name.startswith("redis-") or child.poll() is not None:
                continue
            try:
                environ = Path(f"/proc/{child.pid}/environ").read_bytes().split(b"\0")
                cwd = os.readlink(f"/proc/{child.pid}/cwd")
            except OSError:
                continue
            pythonpath = next((e[11:].decode() for e in environ
                               if e.startswith(b"PYTHONPATH=")), "")
            roots[name] = {"pythonpath": pythonpath, "cwd": cwd}
        return roots

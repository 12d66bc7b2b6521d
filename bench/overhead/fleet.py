"""A benchmark fleet: a private redis-server, one mock engine, one gateway process, and a bare
pass-through proxy (`bench.overhead.bare_proxy`) in front of the same engine as the floor to
compare with.

Two gateways share the Redis: one lists the engine as ``BACKEND_COUNTS[0]`` (4) backends and
one as ``BACKEND_COUNTS[1]`` (64), all at the engine's URL, so that the cost of routing and
admission over a larger fleet is measured on the same engine. The first is "the gateway" of
every figure; the second is measured under the non-streaming and paced loads. That is the
third-party mode: engines listed in ``backends:``, no heartbeats. When the decision modules
run compiled (``routing.native``), a third gateway, the first again with them interpreted, is
measured under the non-streaming load: compiled against interpreted in the same run.

``mode="own"`` measures the gateway on its own fleet instead: 4 simulated workers
(``backends.sim``, 1,000 times the modelled speed, so a step takes microseconds) that heartbeat
and publish KV events to the Redis, found through it (``backends: []``); the bare proxy
forwards to the first of them. No 64-backend gateway (its workers would join the first
gateway's fleet through the same Redis), and no paced load (the mock's pacing control).

The tenant is configured as users run one: all three limits set (requests and tokens per
minute, concurrency), high enough never to refuse, so that every request pays the quota's
Redis round trip, and the gateway's tiers and SLO admission as they ship.

Example::

    with bench_fleet(workdir) as fleet:
        fleet.gateway_url, fleet.api_key, fleet.gateway_pid
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from gateway.cli.localfleet import MOCK_MODEL, SIM_MODEL, LocalFleet
from gateway.cli.localproc import free_port, python_module_argv, wait_http
from routing import native

MODEL = MOCK_MODEL
CHAT_PATH = "/v1/chat/completions"
LIMITS = {"requests_per_minute": 10_000_000, "tokens_per_minute": 1_000_000_000,
          "max_concurrent": 1_000}
BACKEND_COUNTS = (4, 64)
OWN_SIM_FLAGS = ("--speed-factor", "1000", "--heartbeat-interval-s", "0.25")


@dataclass(frozen=True, slots=True)
class BenchFleet:
    engine_url: str
    engine_pid: int
    gateway_url: str
    gateway_pid: int
    floor_url: str
    floor_pid: int
    redis_pid: int
    api_key: str
    model: str = MODEL
    large_url: str = ""  # the gateway with BACKEND_COUNTS[1] backends ("": none, own mode)
    large_pid: int = 0
    mode: str = "third-party"
    # The 4-backend gateway again, with the decision modules interpreted (SWITCHYARD_NATIVE=0),
    # when this one runs them compiled (routing.native): "" and 0 otherwise.
    interpreted_url: str = ""
    interpreted_pid: int = 0

    def proxy(self, endpoint: str) -> tuple[str, int]:
        """URL and process id of a proxy under test: "gateway", "gateway64" ("" and 0 in own
        mode) or "floor" (the bare proxy)."""
        return {"gateway": (self.gateway_url, self.gateway_pid),
                "gateway64": (self.large_url, self.large_pid),
                "gateway_interpreted": (self.interpreted_url, self.interpreted_pid),
                "floor": (self.floor_url, self.floor_pid)}[endpoint]

    def streamed_chunks(self) -> float:
        """The gateway's count of chunks relayed to clients (its Prometheus counter)."""
        text = httpx.get(self.gateway_url + "/metrics", timeout=10).text
        for line in text.splitlines():
            if line.startswith("switchyard_streamed_chunks_total "):
                return float(line.split()[1])
        return 0.0


@contextmanager
def bench_fleet(workdir: Path, model: str = MODEL, mode: str = "third-party"
                ) -> Iterator[BenchFleet]:
    """Start everything, create a tenant and key through the admin API; stop it all on exit."""
    if mode not in ("third-party", "own"):
        raise ValueError(f"mode must be 'third-party' or 'own', not {mode!r}")
    with LocalFleet(workdir, grace_s=5) as fleet:
        if mode == "own":
            model = SIM_MODEL
            engine_urls = fleet.start_sims(BACKEND_COUNTS[0], model=model, flags=OWN_SIM_FLAGS)
            engine_name = "sim"
        else:
            engine_urls = fleet.start_mocks(["engine"], model=model)
            engine_name = "engine"
        engine_url = engine_urls[0]
        floor_port = free_port()
        floor = fleet.group.spawn(
            "bare-proxy", python_module_argv("bench.overhead.bare_proxy", "--port", str(floor_port),
                                             "--upstream", engine_url),
        )
        floor_url = f"http://127.0.0.1:{floor_port}"
        wait_http(floor_url + "/health", group=fleet.group)
        if mode == "own":
            gateway = fleet.start_gateway({"backends": [], "log_level": "warning"})
            _wait_discovered(gateway.url, BACKEND_COUNTS[0])
            large_url, large_pid = "", 0
        else:
            gateway, large = (fleet.start_gateway(_listed(engine_url, model, count),
                                                  name=f"gateway-{count}")
                              for count in BACKEND_COUNTS)
            large_url, large_pid = large.url, large.pid
        interpreted_url, interpreted_pid = "", 0
        if native.STATUS.startswith("compiled") and mode != "own":
            interpreted = fleet.start_gateway(_listed(engine_url, model, BACKEND_COUNTS[0]),
                                              name="gateway-interpreted", env={native.ENV: "0"})
            interpreted_url, interpreted_pid = interpreted.url, interpreted.pid
        api_key = fleet.create_tenant_key(
            gateway.url, {"name": "bench", "models": [model], "limits": LIMITS}, name="bench")
        pids = fleet.pids()
        yield BenchFleet(
            engine_url=engine_url, engine_pid=pids[engine_name], gateway_url=gateway.url,
            gateway_pid=gateway.pid, floor_url=floor_url, floor_pid=floor.pid,
            redis_pid=pids["redis"], api_key=api_key, model=model, large_url=large_url,
            large_pid=large_pid, mode=mode, interpreted_url=interpreted_url,
            interpreted_pid=interpreted_pid,
        )


def _listed(engine_url: str, model: str, count: int) -> dict[str, Any]:
    """A gateway's settings listing the engine as ``count`` backends (third-party mode)."""
    return {"backends": [{"name": f"engine-{i}", "url": engine_url, "models": [model]}
                         for i in range(count)], "log_level": "warning"}


def _wait_discovered(url: str, count: int, timeout_s: float = 20.0) -> None:
    """Wait until the gateway's /metrics counts ``count`` healthy backends (found through
    their heartbeats)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        text = httpx.get(url + "/metrics", timeout=5).text
        healthy = [line for line in text.splitlines()
                   if line.startswith("switchyard_backend_healthy{")
                   and float(line.split()[-1]) == 1.0]
        if len(healthy) >= count:
            return
        time.sleep(0.2)
    raise RuntimeError(f"the gateway at {url} did not find {count} workers in {timeout_s:g} s")

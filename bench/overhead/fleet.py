"""A benchmark fleet: a private redis-server, one mock engine, one gateway process, and a bare
pass-through proxy (`bench.overhead.bare_proxy`) in front of the same engine as the floor to
compare with.

Two gateways share the Redis: one lists the engine as ``BACKEND_COUNTS[0]`` (4) backends and
one as ``BACKEND_COUNTS[1]`` (64), all at the engine's URL, so that the cost of routing and
admission over a larger fleet is measured on the same engine. The first is "the gateway" of
every figure; the second is measured under the non-streaming and paced loads.

The tenant is configured as users run one: all three limits set (requests and tokens per
minute, concurrency), high enough never to refuse, so that every request pays the quota's
Redis round trip, and the gateway's tiers and SLO admission as they ship.

Example::

    with bench_fleet(workdir) as fleet:
        fleet.gateway_url, fleet.api_key, fleet.gateway_pid
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from gateway.cli.localfleet import MOCK_MODEL, LocalFleet
from gateway.cli.localproc import free_port, python_module_argv, wait_http

MODEL = MOCK_MODEL
CHAT_PATH = "/v1/chat/completions"
LIMITS = {"requests_per_minute": 10_000_000, "tokens_per_minute": 1_000_000_000,
          "max_concurrent": 1_000}
BACKEND_COUNTS = (4, 64)


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
    large_url: str = ""  # the gateway with BACKEND_COUNTS[1] backends
    large_pid: int = 0

    def streamed_chunks(self) -> float:
        """The gateway's count of chunks relayed to clients (its Prometheus counter)."""
        text = httpx.get(self.gateway_url + "/metrics", timeout=10).text
        for line in text.splitlines():
            if line.startswith("switchyard_streamed_chunks_total "):
                return float(line.split()[1])
        return 0.0


@contextmanager
def bench_fleet(workdir: Path, model: str = MODEL) -> Iterator[BenchFleet]:
    """Start everything, create a tenant and key through the admin API; stop it all on exit."""
    with LocalFleet(workdir, grace_s=5) as fleet:
        [engine_url] = fleet.start_mocks(["engine"], model=model)
        floor_port = free_port()
        floor = fleet.group.spawn(
            "bare-proxy", python_module_argv("bench.overhead.bare_proxy", "--port", str(floor_port),
                                             "--upstream", engine_url),
        )
        floor_url = f"http://127.0.0.1:{floor_port}"
        wait_http(floor_url + "/health", group=fleet.group)
        gateway, large = (fleet.start_gateway({
            "backends": [{"name": f"engine-{i}", "url": engine_url, "models": [model]}
                         for i in range(count)],
            "log_level": "warning",
        }) for count in BACKEND_COUNTS)
        api_key = fleet.create_tenant_key(
            gateway.url, {"name": "bench", "models": [model], "limits": LIMITS}, name="bench")
        pids = fleet.pids()
        yield BenchFleet(
            engine_url=engine_url, engine_pid=pids["engine"], gateway_url=gateway.url,
            gateway_pid=gateway.pid, floor_url=floor_url, floor_pid=floor.pid,
            redis_pid=pids["redis"], api_key=api_key, model=model, large_url=large.url,
            large_pid=large.pid,
        )

"""What one request costs Redis, and the gateway's CPU, on one Redis and on a Redis Cluster.

Each run starts a fresh fleet (`gateway.cli.localfleet.LocalFleet`): a private ``redis-server``
or a private 3-primary Redis Cluster, 4 simulated workers and one gateway with every feature on
(prefix-affinity routing, SLO admission, quotas with request, token and concurrency limits,
usage accounting). ``own`` mode: the workers join through Redis heartbeats and publish KV
events; ``third-party``: they are listed in ``backends:`` and never touch Redis.

Two windows are measured on every Redis node, from ``INFO commandstats`` after ``CONFIG
RESETSTAT``: an idle one (what the fleet costs Redis with no traffic: heartbeats, polls, the
approximate-index stream's blocking reads) and a loaded one (``--requests`` chat requests, 8
tenants, 24 system prompts, ``--concurrency`` at a time). Per-request figures are the loaded
window's calls less the idle rate over its length. On a cluster each primary's share of the
per-request calls shows how the hash slots spread them. The gateway's CPU per request (less its
idle rate: background tasks) gives the cores one replica needs per 1,000 requests a second.

Example::

    python -m bench.redis_ops                       # plain and cluster, both modes
    python -m bench.redis_ops --redis cluster --mode own --requests 600
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import orjson
import redis

from bench.common.fleet_modes import MODES, Mode, parse_modes, static_backends, wait_for_backends
from bench.common.paths import RESULTS_DIR
from bench.common.procstat import cpu_seconds
from bench.common.report import machine
from gateway.cli.localfleet import SIM_MODEL, LocalFleet

NUM_TENANTS = 8
NUM_SYSTEMS = 24
REDIS_KINDS = ("plain", "cluster")
Counts = dict[str, float]  # command -> calls


def _nodes(fleet: LocalFleet) -> list[redis.Redis]:
    ports = fleet.redis_ports or [int(urlsplit(fleet.redis_url).port or 6379)]
    return [redis.Redis(port=port, socket_timeout=5) for port in ports]


def _primaries(nodes: list[redis.Redis]) -> list[redis.Redis]:
    return [n for n in nodes if n.info("replication")["role"] == "master"]


def _reset(nodes: list[redis.Redis]) -> None:
    for node in nodes:
        node.config_resetstat()


def _calls(node: redis.Redis) -> Counts:
    stats: Any = node.info("commandstats")
    return {name.removeprefix("cmdstat_"): float(values["calls"])
            for name, values in stats.items()}


def _redis_cpu_s(nodes: list[redis.Redis]) -> float:
    total = 0.0
    for node in nodes:
        info: Any = node.info("cpu")
        total += float(info["used_cpu_user"]) + float(info["used_cpu_sys"])
    return total


# The bench's own commands and the cluster client's topology reads.
_IGNORED = {"config|resetstat", "config", "info", "cluster|nodes", "cluster|slots",
            "cluster|info", "cluster", "command", "command|docs", "ping", "monitor"}


class Monitors:
    """``MONITOR`` on each node, in a thread each, counting the commands clients send
    (``sent``) and those scripts run inside Redis (``in_scripts``), by name, while open.
    Its own overhead slows Redis, so CPU is measured in a window without it."""

    def __init__(self, nodes: list[redis.Redis]) -> None:
        self.sent: Counts = {}
        self.in_scripts: Counts = {}
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._watch, args=(node,), daemon=True)
                         for node in nodes]
        self._started = [threading.Event() for _ in nodes]

    def __enter__(self) -> Monitors:
        for thread in self._threads:
            thread.start()
        for started in self._started:
            started.wait(5)
        return self

    def __exit__(self, *exc: object) -> None:
        time.sleep(0.2)  # the last commands' echoes
        self._stop.set()
        for thread in self._threads:
            thread.join(5)

    def _watch(self, node: redis.Redis) -> None:
        kwargs = node.connection_pool.connection_kwargs
        watcher = redis.Redis(host=kwargs.get("host", "127.0.0.1"), port=kwargs["port"],
                              socket_timeout=0.2)
        index = next(i for i, t in enumerate(self._threads) if t is threading.current_thread())
        with watcher.monitor() as monitor:  # type: ignore[no-untyped-call]
            self._started[index].set()
            while not self._stop.is_set():
                try:
                    command: Any = monitor.next_command()
                except redis.TimeoutError:
                    continue
                except redis.ConnectionError:
                    return  # the node went away (the fleet is stopping)
                name = str(command["command"]).split(" ", 1)[0].strip('"').lower()
                target = self.in_scripts if command.get("client_type") == "lua" else self.sent
                with self._lock:
                    target[name] = target.get(name, 0.0) + 1


def _merge(per_node: list[Counts]) -> Counts:
    merged: Counts = {}
    for counts in per_node:
        for name, calls in counts.items():
            if name not in _IGNORED:
                merged[name] = merged.get(name, 0.0) + calls
    return merged


def _settings(mode: Mode, worker_urls: list[str]) -> dict[str, Any]:
    routing: dict[str, Any] = {"profile": "prefix_affinity"}
    backends: list[dict[str, Any]] = []
    if mode == "own":
        routing["tokenizers"] = {SIM_MODEL: "approx"}
    else:
        routing["discover_workers"] = False
        backends = static_backends(worker_urls, SIM_MODEL)
    return {"backends": backends, "routing": routing, "log_level": "warning"}


async def _drive(url: str, keys: list[str], num_requests: int, concurrency: int,
                 seed: int) -> dict[str, int]:
    """``num_requests`` chats, ``concurrency`` at a time (bounded by count); status counts."""
    rng = random.Random(seed)
    plan = [(rng.choice(keys), rng.randrange(NUM_SYSTEMS), i) for i in range(num_requests)]
    statuses: dict[str, int] = {}
    queue = iter(plan)

    async def worker(client: httpx.AsyncClient) -> None:
        for key, system, index in queue:
            body = {"model": SIM_MODEL, "max_tokens": 8, "messages": [
                {"role": "system", "content": f"system prompt {system}: " + "policy text " * 60},
                {"role": "user", "content": f"question {index}"}]}
            response = await client.post(url, json=body, timeout=60,
                                         headers={"Authorization": f"Bearer {key}"})
            statuses[str(response.status_code)] = statuses.get(str(response.status_code), 0) + 1

    async with httpx.AsyncClient(limits=httpx.Limits(max_connections=concurrency)) as client:
        await asyncio.gather(*(worker(client) for _ in range(concurrency)))
    return statuses


def measure(kind: str, mode: Mode, workdir: Path, *, num_requests: int, concurrency: int,
            idle_s: float, seed: int) -> dict[str, Any]:
    with LocalFleet(workdir, grace_s=5, redis_cluster=kind == "cluster") as fleet:
        is_own = mode == "own"
        worker_urls = fleet.start_sims(4, model=SIM_MODEL, has_redis=is_own,
                                       health_timeout_s=None if is_own else 30)
        gateway = fleet.start_gateway(_settings(mode, worker_urls), ready_path="/healthz",
                                      ready_timeout_s=30)
        wait_for_backends(gateway.url, fleet.admin_token, 4, mode, fleet.group)
        limits = {"requests_per_minute": 1_000_000, "tokens_per_minute": 1_000_000_000,
                  "max_concurrent": 256}
        keys = [fleet.create_tenant_key(gateway.url, {"id": f"ops-{i}", "name": f"ops {i}",
                                                      "limits": limits})
                for i in range(NUM_TENANTS)]
        url = gateway.url + "/v1/chat/completions"
        asyncio.run(_drive(url, keys, 100, concurrency, seed + 1))  # warm-up: caches, scripts
        nodes = _nodes(fleet)
        primaries = _primaries(nodes)

        # What is sent: idle, then loaded, counted by MONITOR.
        idle_cpu_start = cpu_seconds(gateway.pid)
        with Monitors(primaries) as idle:
            time.sleep(idle_s)
        gateway_idle_cores = (cpu_seconds(gateway.pid) - idle_cpu_start) / idle_s
        num_counted = max(1, num_requests // 2)
        with Monitors(primaries) as loaded:
            started = time.monotonic()
            asyncio.run(_drive(url, keys, num_counted, concurrency, seed + 2))
            counted_s = time.monotonic() - started

        # CPU, and per-node command counts, with nothing watching.
        _reset(nodes)
        redis_cpu_start = _redis_cpu_s(nodes)
        cpu_start = cpu_seconds(gateway.pid)
        started = time.monotonic()
        statuses = asyncio.run(_drive(url, keys, num_requests, concurrency, seed))
        elapsed_s = time.monotonic() - started
        # Less what the gateway's background tasks used meanwhile (as when idle).
        gateway_cpu_s = cpu_seconds(gateway.pid) - cpu_start - gateway_idle_cores * (
            time.monotonic() - started)
        redis_cpu_s = _redis_cpu_s(nodes) - redis_cpu_start
        per_node = [_merge([_calls(n)]) for n in primaries]

    def per_request(during: Counts, background: Counts) -> Counts:
        names = set(during) - _IGNORED
        return {name: round(max(0.0, during.get(name, 0.0) - background.get(name, 0.0)
                                / idle_s * counted_s) / num_counted, 3)
                for name in sorted(names)}

    sent = per_request(loaded.sent, idle.sent)
    in_scripts = per_request(loaded.in_scripts, idle.in_scripts)
    node_calls = [sum(counts.values()) for counts in per_node]
    mean_calls = sum(node_calls) / len(node_calls)
    return {
        "redis": kind, "mode": mode, "num_requests": num_requests, "statuses": statuses,
        "elapsed_s": elapsed_s, "requests_per_s": num_requests / elapsed_s,
        "idle_sent_per_s": {k: round(v / idle_s, 2) for k, v in sorted(idle.sent.items())
                            if k not in _IGNORED},
        "sent_per_request": {k: v for k, v in sent.items() if v >= 0.001},
        "in_scripts_per_request": {k: v for k, v in in_scripts.items() if v >= 0.001},
        "total_sent_per_request": round(sum(sent.values()), 3),
        "total_in_scripts_per_request": round(sum(in_scripts.values()), 3),
        "gateway_idle_cores": gateway_idle_cores,
        "gateway_cpu_us_per_request": gateway_cpu_s / num_requests * 1e6,
        "gateway_cores_per_1k_rps": gateway_cpu_s / num_requests * 1000,
        "redis_cpu_us_per_request": redis_cpu_s / num_requests * 1e6,
        "primary_share": [round(c / sum(node_calls), 3) for c in node_calls],
        "busiest_primary_to_mean": max(node_calls) / mean_calls if mean_calls else 1.0,
    }


def _row(result: Mapping[str, Any]) -> str:
    sent = result["sent_per_request"]
    top = ", ".join(f"{name} {value:.2f}" for name, value in
                    sorted(sent.items(), key=lambda item: -item[1]) if value >= 0.01)
    return (f"| {result['redis']} | {result['mode']} | {result['total_sent_per_request']:.2f} | "
            f"{top} | {result['total_in_scripts_per_request']:.2f} | "
            f"{result['redis_cpu_us_per_request']:.0f} | "
            f"{result['gateway_cores_per_1k_rps']:.2f} | "
            f"{' / '.join(f'{s:.2f}' for s in result['primary_share'])} |")


def markdown(results: Sequence[Mapping[str, Any]]) -> str:
    lines = ["| Redis | mode | commands sent / request | of which | commands in scripts / "
             "request | Redis CPU-µs / request | gateway cores per 1k req/s | primaries' "
             "shares of the work |",
             "| --- | --- | ---: | --- | ---: | ---: | ---: | --- |"]
    return "\n".join([*lines, *(_row(r) for r in results)])


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.redis_ops", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--redis", choices=(*REDIS_KINDS, "both"), default="both")
    parser.add_argument("--mode", choices=(*MODES, "both"), default="both")
    parser.add_argument("--requests", type=int, default=1500)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--idle-s", type=float, default=5.0)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--out", type=Path, help="results JSON (default bench/results/...)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    kinds = REDIS_KINDS if args.redis == "both" else (args.redis,)
    results = []
    for kind in kinds:
        for mode in parse_modes(args.mode):
            with tempfile.TemporaryDirectory(prefix="sy-redis-ops-") as tmp:
                result = measure(kind, mode, Path(tmp), num_requests=max(1, args.requests),
                                 concurrency=max(1, args.concurrency), idle_s=args.idle_s,
                                 seed=args.seed)
            results.append(result)
            print(f"{kind} / {mode}: {result['total_sent_per_request']:.2f} Redis commands sent "
                  f"per request, statuses {result['statuses']}", file=sys.stderr, flush=True)
    print(markdown(results))
    out = args.out or RESULTS_DIR / f"redis-ops-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(orjson.dumps({"machine": machine(), "args": vars(args) | {"out": str(out)},
                                  "results": results}, option=orjson.OPT_INDENT_2))
    print(f"results: {out}", file=sys.stderr)
    return 0

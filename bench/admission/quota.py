"""Quota accuracy across gateway replicas, and what admission costs per request.

Both run on their own fleet: a private Redis, one zero-delay mock engine (listed in the
configuration) and gateways in front of it, so only the gateways' work is measured.

**Quota accuracy.** One tenant with ``requests_per_minute = N`` is hammered through three
replicas sharing the Redis (uniform arrivals, round robin across the replicas, non-streaming,
SLO admission off so only the quota decides). The quota is a GCRA with a burst of N: hammered
from a fresh start, it admits exactly ``floor(N * (1 + elapsed_s / 60))`` requests by
``elapsed_s``. The run compares what was admitted with that allowance, and, after the burst is
spent (the first 429), the admitted rate with ``N / 60`` per second.

**Admission cost.** `bench.common.loadgen` (its own process) drives a closed loop at concurrency 4
(the gateway admits at most 4 in flight on a backend whose load it cannot read, like this mock)
at four set-ups: SLO admission off or on, and a tenant without limits or with all three limits
set (high enough never to refuse). It reports the gateway's and Redis's CPU-µs per request
(/proc/PID/stat), the cores other processes kept busy meanwhile (the machine's busy time less
the load generator, gateway, engine and Redis), and Redis calls per request (INFO
commandstats before and after, warm-up included): EVALSHA calls, the round trips they took (the
gateway's ``switchyard_quota_redis_round_trips_total``: concurrent calls share a pipeline and a
settle rides with the next acquire), the commands the scripts run inside Redis, and everything
else (background work of the gateways, e.g. fleet polls, spread over the requests).

Example::

    quota = measure_quota(fleet, replicas, rpm=600, rate_per_s=50, window_s=60)
    costs = measure_costs(fleet, {False: off, True: on}, num_requests=5000, num_warmup=300,
                          runs=3)
"""

from __future__ import annotations

import asyncio
import math
import re
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

import aiohttp
import httpx
import orjson
import uvloop

from admission.quota.lua import OPS_SCRIPT
from bench.admission.fleet import MOCK_MODEL, Fleet, GatewayProc, provision, scrape
from bench.common.loadgen import chat_body, json_headers
from bench.common.stats import median

CHAT_PATH = "/v1/chat/completions"
ALL_LIMITS = {"requests_per_minute": 10_000_000, "tokens_per_minute": 1_000_000_000,
              "max_concurrent": 1_000}
# Commands the quota scripts run inside Redis: INFO commandstats counts them too, but they are
# no round trips (a command of the same name sent by a client would be counted with them).
SCRIPT_COMMANDS = frozenset(
    name.lower() for name in re.findall(r"redis\.call\('([A-Z]+)'", OPS_SCRIPT.text))
COST_SETUPS = (("off", False, False), ("quota_only", False, True), ("slo_only", True, False),
               ("on", True, True))  # name, SLO admission, tenant limits


async def _hammer(urls: Sequence[str], key: str, rate_per_s: float, window_s: float
                  ) -> list[tuple[float, int]]:
    """Uniform arrivals for ``window_s``, round robin over ``urls``: (sent at, status) each."""
    body = chat_body(MOCK_MODEL, 1)
    headers = json_headers(key)
    sent: list[tuple[float, int]] = []

    async def one(session: aiohttp.ClientSession, url: str, at_s: float) -> None:
        try:
            async with session.post(url, data=body, headers=headers) as resp:
                await resp.read()
                sent.append((at_s, resp.status))
        except (aiohttp.ClientError, TimeoutError, OSError):
            sent.append((at_s, 0))

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        started = time.perf_counter()
        tasks = []
        for index in range(int(rate_per_s * window_s)):
            delay_s = started + index / rate_per_s - time.perf_counter()
            if delay_s > 0:
                await asyncio.sleep(delay_s)
            url = urls[index % len(urls)] + CHAT_PATH
            tasks.append(asyncio.create_task(one(session, url, time.perf_counter() - started)))
        await asyncio.gather(*tasks)
    return sorted(sent)


def quota_figures(sent: Sequence[tuple[float, int]], rpm: int) -> dict[str, Any]:
    """Admitted against the GCRA's allowance, overall and after the burst (pure)."""
    admitted = [at for at, status in sent if status == 200]
    refused = [at for at, status in sent if status == 429]
    elapsed_s = sent[-1][0] - sent[0][0] if sent else 0.0
    allowance = math.floor(rpm * (1 + elapsed_s / 60) + 1e-9)
    figures: dict[str, Any] = {
        "num_sent": len(sent), "num_admitted": len(admitted), "num_refused": len(refused),
        "num_other": len(sent) - len(admitted) - len(refused), "window_s": elapsed_s,
        "allowance": allowance,
        "error_pct": (len(admitted) - allowance) / allowance * 100 if allowance else None,
    }
    if refused and sent:
        burst_end_s = refused[0]
        steady_s = sent[-1][0] - burst_end_s
        num_steady = sum(at > burst_end_s for at in admitted)
        figures.update({
            "burst_spent_at_s": burst_end_s, "steady_window_s": steady_s,
            "steady_admitted": num_steady, "steady_expected": steady_s * rpm / 60,
            "steady_rate_error_pct": ((num_steady / (steady_s * rpm / 60) - 1) * 100
                                      if steady_s > 0 else None),
        })
    return figures


def measure_quota(fleet: Fleet, replicas: Sequence[GatewayProc], *, rpm: int, rate_per_s: float,
                  window_s: float) -> dict[str, Any]:
    """Hammer one tenant with ``rpm`` through every replica; see the module docstring."""
    keys = provision(replicas[0].url, fleet.admin_token, ["quota"], ["standard"],
                     limits={"requests_per_minute": rpm})
    before = fleet.redis_calls()
    sent = uvloop.run(_hammer([r.url for r in replicas], keys["quota"]["standard"], rate_per_s,
                              window_s))
    after = fleet.redis_calls()
    figures = quota_figures(sent, rpm)
    per_replica = []
    for replica in replicas:
        samples = scrape(replica.url + "/metrics")
        checks = samples.get("switchyard_quota_checks_total", 0.0)
        refused = samples.get("switchyard_quota_refusals_total", 0.0)
        per_replica.append({"checks": checks, "refusals": refused, "admitted": checks - refused})
    figures.update({
        "rpm": rpm, "rate_per_s": rate_per_s, "num_replicas": len(replicas),
        "per_replica": per_replica,
        "admitted_by_gateways": sum(r["admitted"] for r in per_replica),
        "evalsha_per_request": (after.get("evalsha", 0) - before.get("evalsha", 0)) / len(sent),
    })
    return figures


def _loadgen(gateway: GatewayProc, key: str, num_requests: int, num_warmup: int,
             watch: Mapping[str, int]) -> dict[str, Any]:
    argv = [sys.executable, "-m", "bench.common.loadgen", "--url", gateway.url + CHAT_PATH,
            "--key", key, "--model", MOCK_MODEL, "--json", "--mode", "closed",
            "--concurrency", "4", "--requests", str(num_requests), "--duration", "120",
            "--max-tokens", "16", "--warmup", str(num_warmup)]
    for name, pid in {"gateway": gateway.pid, **watch}.items():
        argv += ["--watch", f"{name}={pid}"]
    done = subprocess.run(argv, capture_output=True, timeout=300, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"loadgen failed: {done.stderr.decode()[-2000:]}")
    result: dict[str, Any] = orjson.loads(done.stdout)
    if result["num_errors"]:
        raise RuntimeError(f"{result['num_errors']} requests failed: {result['first_error']}")
    return result


def _quota_round_trips(origin: str) -> float:
    """The gateway's count of quota round trips to Redis (its Prometheus counter)."""
    for line in httpx.get(origin + "/metrics", timeout=10).text.splitlines():
        if line.startswith("switchyard_quota_redis_round_trips_total "):
            return float(line.split()[1])
    return 0.0


def measure_costs(fleet: Fleet, gateways: Mapping[bool, GatewayProc], *, num_requests: int,
                  num_warmup: int, runs: int) -> dict[str, Any]:
    """CPU-µs and Redis calls per request for each of `COST_SETUPS`, medians of ``runs``;
    ``gateways`` maps "SLO admission on" to a gateway configured so."""
    origin = gateways[False].url
    unlimited = provision(origin, fleet.admin_token, ["cost-free"], ["standard"])
    limited = provision(origin, fleet.admin_token, ["cost-limited"], ["standard"],
                        limits=ALL_LIMITS)
    watch = {name: pid for name, pid in fleet.pids().items() if name in ("mock", "redis")}
    samples: dict[str, list[dict[str, float]]] = {name: [] for name, _, _ in COST_SETUPS}
    for _ in range(runs):
        for name, slo_on, has_limits in COST_SETUPS:
            key = (limited["cost-limited"] if has_limits else unlimited["cost-free"])["standard"]
            before = fleet.redis_calls()
            trips_before = _quota_round_trips(gateways[slo_on].url)
            result = _loadgen(gateways[slo_on], key, num_requests, num_warmup, watch)
            trips = _quota_round_trips(gateways[slo_on].url) - trips_before
            after = fleet.redis_calls()
            num_sent = result["num_ok"] + num_warmup
            calls = {cmd: after[cmd] - before.get(cmd, 0) for cmd in after if cmd != "info"}
            inner = sum(n for cmd, n in calls.items() if cmd in SCRIPT_COMMANDS)
            cpu_s = result["cpu_s"]
            samples[name].append({
                "gateway_cpu_us_per_request": cpu_s["gateway"] / result["num_ok"] * 1e6,
                "redis_cpu_us_per_request": cpu_s["redis"] / result["num_ok"] * 1e6,
                "requests_per_s": result["requests_per_s"],
                "p50_ms": result["p50_ms"], "p99_ms": result["p99_ms"],
                "evalsha_per_request": calls.get("evalsha", 0) / num_sent,
                "quota_round_trips_per_request": trips / num_sent,
                "script_commands_per_request": inner / num_sent,
                "other_redis_calls_per_request": (sum(calls.values()) - inner
                                                  - calls.get("evalsha", 0)) / num_sent,
                "others_cores_busy": max(0.0, (result["machine_busy_cpu_s"]
                                               - sum(cpu_s.values())) / result["elapsed_s"]),
            })
    return {name: {figure: median([run[figure] for run in runs_of])
                   for figure in runs_of[0]} | {"runs": runs_of}
            for name, runs_of in samples.items()}

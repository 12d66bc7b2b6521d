"""What each feature costs a proxied request, live: the gateway with features turned off one at a
time, against its own floor (``bench.overhead.lean_proxy``) and the bare aiohttp proxy.

The compiled build hides the request path's frames from py-spy (``bench.overhead.profile``),
so the features are weighed here by leaving them out instead. One mock engine; each gateway
lists it as 4 backends (``--mode own``: 4 simulated workers, found through their
heartbeats); closed loop, 32 in flight, non-streaming (the overhead bench's
``nonstream`` load); every endpoint is measured once per round, ``--rounds`` rounds, and the
medians are printed with each figure's excess over the floor::

    python -m bench.overhead.ablation                 # 3 rounds of 15,000 requests, ~5 minutes
    python -m bench.overhead.ablation --requests 2000 --rounds 1   # smoke
    python -m bench.overhead.ablation --mode own      # on simulated workers found by heartbeat

Endpoints: ``floor`` (the gateway's server and upstream client, nothing else), ``bare`` (aiohttp
server and client), ``full`` (as users run it: a tenant with all three limits), ``no_limits``
(the same gateway, a tenant without limits: no quota), ``no_slo`` (``admission.slo_enabled``
off), ``no_usage`` (``usage.enabled`` off), ``round_robin`` (``routing.profile: round_robin``:
no prefix-affinity decision), ``minimal`` (all four off). Raw figures go to
``bench/results/ablation-<timestamp>.json``.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson

from bench.common.paths import RESULTS_DIR
from bench.overhead.fleet import (
    BACKEND_COUNTS,
    CHAT_PATH,
    LIMITS,
    MODEL,
    OWN_SIM_FLAGS,
    _listed,
    _wait_discovered,
)
from gateway.cli.localfleet import SIM_MODEL, LocalFleet
from gateway.cli.localproc import free_port, python_module_argv, wait_http
from routing import native

# Each gateway's settings over the 4-backend listing, and whether its tenant has limits.
GATEWAYS: dict[str, tuple[dict[str, Any], bool]] = {
    "full": ({}, True),
    "no_limits": ({}, False),  # the "full" gateway, another tenant
    "no_slo": ({"admission": {"slo_enabled": False}}, True),
    "no_usage": ({"usage": {"enabled": False}}, True),
    "round_robin": ({"routing": {"profile": "round_robin"}}, True),
    "minimal": ({"admission": {"slo_enabled": False}, "usage": {"enabled": False},
                 "routing": {"profile": "round_robin"}}, False),
}


def cpu_us_per_request(url: str, key: str, pid: int, num_requests: int, model: str) -> float:
    """The process's CPU-µs per request over ``num_requests`` (after a warm-up)."""
    argv = [sys.executable, "-m", "bench.common.loadgen", "--url", url + CHAT_PATH, "--key", key,
            "--model", model, "--mode", "closed", "--concurrency", "32", "--requests",
            str(num_requests), "--warmup", str(max(100, num_requests // 10)), "--duration", "120",
            "--watch", f"proxy={pid}", "--json"]
    done = subprocess.run(argv, capture_output=True, timeout=300, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"loadgen failed: {done.stderr.decode()[-2000:]}")
    result = orjson.loads(done.stdout)
    if result["num_errors"]:
        raise RuntimeError(f"{result['num_errors']} requests to {url} failed: "
                           f"{result['first_error']}")
    return float(1e6 * result["cpu_s"]["proxy"] / result["num_ok"])


def measure(num_requests: int, num_rounds: int, mode: str = "third-party"
            ) -> dict[str, list[float]]:
    """Every endpoint's CPU-µs per request, one figure per round. ``mode`` "own": the
    gateways find 4 simulated workers through their heartbeats (no ``backends:``), and the
    floor and bare proxy forward to the first."""
    with LocalFleet(Path(tempfile.mkdtemp(prefix="sy-ablation-")), grace_s=5) as fleet:
        if mode == "own":
            model = SIM_MODEL
            sims = fleet.start_sims(BACKEND_COUNTS[0], model=model, flags=OWN_SIM_FLAGS)
            engine_url, listing = sims[0], {"backends": [], "log_level": "warning"}
        else:
            model = MODEL
            engine_url = fleet.start_mocks(["engine"], model=model)[0]
            listing = _listed(engine_url, model, BACKEND_COUNTS[0])
        endpoints: list[tuple[str, str, int, str]] = []
        for name, module in (("floor", "bench.overhead.lean_proxy"),
                             ("bare", "bench.overhead.bare_proxy")):
            port = free_port()
            child = fleet.group.spawn(name, python_module_argv(
                module, "--port", str(port), "--upstream", engine_url))
            wait_http(f"http://127.0.0.1:{port}/health", group=fleet.group)
            endpoints.append((name, f"http://127.0.0.1:{port}", child.pid, "unused"))
        started: dict[str, tuple[str, int]] = {}
        for name, (extra, is_limited) in GATEWAYS.items():
            if name == "no_limits":
                url, pid = started["full"]
            else:
                gateway = fleet.start_gateway({**listing, **extra}, name=name)
                url, pid = started[name] = gateway.url, gateway.pid
                if mode == "own":
                    _wait_discovered(url, BACKEND_COUNTS[0])
            tenant = {"name": f"ablation-{name}", "models": [model],
                      **({"limits": LIMITS} if is_limited else {})}
            endpoints.append((name, url, pid, fleet.create_tenant_key(url, tenant, name=name)))
        figures: dict[str, list[float]] = {name: [] for name, _, _, _ in endpoints}
        for _ in range(num_rounds):
            for name, url, pid, key in endpoints:
                figures[name].append(cpu_us_per_request(url, key, pid, num_requests, model))
        return figures


def table(figures: dict[str, list[float]]) -> str:
    medians = {name: statistics.median(runs) for name, runs in figures.items()}
    lines = ["| endpoint | CPU-µs per request | over the floor | / bare proxy | runs |",
             "| --- | ---: | ---: | ---: | --- |"]
    for name, runs in figures.items():
        lines.append(f"| {name} | {medians[name]:.0f} | {medians[name] - medians['floor']:+.0f} "
                     f"| {medians[name] / medians['bare']:.2f} | "
                     f"{', '.join(f'{r:.0f}' for r in runs)} |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.overhead.ablation",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=15_000, help="measured per endpoint")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--mode", choices=("third-party", "own"), default="third-party",
                        help="the engine listed in backends: (a mock), or simulated workers "
                             "found through their heartbeats")
    parser.add_argument("--results-dir", type=Path, default=RESULTS_DIR)
    args = parser.parse_args(argv)
    figures = measure(args.requests, args.rounds, args.mode)
    print(f"decision and request-path modules: {native.STATUS}")
    print(table(figures))
    args.results_dir.mkdir(parents=True, exist_ok=True)
    path = args.results_dir / f"ablation-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_bytes(orjson.dumps({
        "benchmark": "overhead.ablation", "command": " ".join(sys.argv), "native": native.STATUS,
        "mode": args.mode, "requests": args.requests, "rounds": args.rounds,
        "cpu_us_per_request": figures,
    }, option=orjson.OPT_INDENT_2))
    print(f"results: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

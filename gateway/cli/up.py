"""`switchyard up`: a private Redis, local engines and the gateway, with a demo key printed.

Ctrl-C (or SIGTERM) stops every child in reverse order of starting.
"""

from __future__ import annotations

import argparse
import importlib.util
import shlex
import sys
import tempfile
from pathlib import Path

from gateway.cli.localfleet import (
    MOCK_MODEL,
    SIM_MODEL,
    WORKER_MODEL,
    LocalFleet,
    catch_stop_signals,
)

DEMO_TENANT = {"id": "demo", "name": "Demo tenant", "tier": "standard", "models": ["*"]}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="127.0.0.1", help="gateway listen address")
    parser.add_argument("--port", type=int, default=8080, help="gateway port")
    parser.add_argument("--redis-url", help="use this Redis instead of starting a private one")
    parser.add_argument("--redis-cluster", action="store_true",
                        help="start a private 3-primary Redis Cluster instead of one redis-server "
                        "(needs redis-cli)")
    parser.add_argument("--workers", type=int, default=4, help="number of local engines")
    parser.add_argument("--engine", choices=("sim", "mock"), default="sim",
                        help="simulated GPU workers (default) or the trivial mock engine")
    parser.add_argument("--model", help="model name the engines serve "
                        f"(default {SIM_MODEL} or {MOCK_MODEL})")
    parser.add_argument("--tokenizer", choices=("real", "approx"), default="real",
                        help="sim engines: the model's real tokenizer or a fast approximation")
    parser.add_argument("--token-delay-ms", type=float, default=20.0,
                        help="mock engines: time per output token")
    parser.add_argument("--pytorch-workers", type=int, default=0, metavar="N",
                        help="also run N bundled PyTorch workers (`switchyard worker`, the real "
                        f"{WORKER_MODEL} on the CPU), joining through Redis")


def run(args: argparse.Namespace) -> int:
    if args.pytorch_workers > 0 and importlib.util.find_spec("torch") is None:
        # find_spec only locates the package: this process never loads torch.
        raise SystemExit("switchyard up: --pytorch-workers needs PyTorch, which this environment "
                         "lacks: run `SWITCHYARD_WORKER=1 scripts/setup.sh` (the CPU build)")
    workdir = Path(tempfile.mkdtemp(prefix="switchyard-up-"))
    is_stopped = catch_stop_signals()
    if args.redis_cluster and args.redis_url:
        raise SystemExit("switchyard up: --redis-cluster starts a private cluster; give it or "
                         "--redis-url (a redis+cluster:// URL for yours), not both")
    with LocalFleet(workdir, redis_url=args.redis_url,
                    redis_cluster=args.redis_cluster) as fleet:
        model = args.model or (SIM_MODEL if args.engine == "sim" else MOCK_MODEL)
        if args.workers < 0 or args.pytorch_workers < 0:
            raise SystemExit("switchyard up: --workers and --pytorch-workers must be >= 0")
        if args.engine == "sim":
            urls = fleet.start_sims(args.workers, model=model, tokenizer=args.tokenizer,
                                    health_timeout_s=None)
        else:
            urls = fleet.start_mocks([f"engine-{i}" for i in range(args.workers)], model=model,
                                     flags=["--token-delay-ms", str(args.token_delay_ms)],
                                     health_timeout_s=None)
        worker_urls = fleet.start_pytorch_workers(args.pytorch_workers, health_timeout_s=None)
        fleet.wait_healthy(urls, timeout_s=20)
        fleet.wait_healthy(worker_urls, timeout_s=180)
        # Simulated workers join through their Redis heartbeats (no list needed); the mock
        # engines, like any engine switchyard did not start, are listed.
        backends = [] if args.engine == "sim" else [
            {"name": f"mock-{i}", "url": url, "models": [model]} for i, url in enumerate(urls)
        ]
        gateway = fleet.start_gateway({
            "backends": backends,
            "routing": {"tokenizers": {
                **({model: args.tokenizer} if args.engine == "sim" else {}),
                **({WORKER_MODEL: "real"} if worker_urls else {})}},
            "drain_timeout_s": 10,
        }, host=args.host, port=args.port, config_name="switchyard.yaml")
        key = _demo_key(fleet, gateway.url)
        _print_banner(gateway.url, key, model, fleet.admin_token, workdir)
        if worker_urls:
            print(f"  {len(worker_urls)} PyTorch worker(s) serve the real model too: "
                  f'"model": "{WORKER_MODEL}"\n', flush=True)
        exit_status = fleet.serve_until_stopped(is_stopped, "the local fleet")
    if exit_status == 0:
        print("stopped.")
    return exit_status


def _demo_key(fleet: LocalFleet, origin: str) -> str:
    """A key of the demo tenant, which may exist already (a shared ``--redis-url``)."""
    return fleet.create_tenant_key(origin, DEMO_TENANT, is_existing_ok=True, name="demo")


def _print_banner(base: str, key: str, model: str, admin_token: str, workdir: Path) -> None:
    # This interpreter by its absolute path: it has the openai package, a bare `python` on PATH
    # may not (or may not exist at all, as on Debian).
    python = shlex.quote(sys.executable)
    print(f"""
switchyard is up at {base}   (logs and config in {workdir})

  demo tenant: demo      demo key: {key}
  admin token: {admin_token}

  curl {base}/v1/chat/completions \\
    -H "Authorization: Bearer {key}" -H "Content-Type: application/json" \\
    -d '{{"model": "{model}", "messages": [{{"role": "user", "content": "hello there"}}]}}'

  {python} -c '
from openai import OpenAI
client = OpenAI(base_url="{base}/v1", api_key="{key}")
print(client.chat.completions.create(model="{model}",
      messages=[{{"role": "user", "content": "hello there"}}]).choices[0].message.content)'

Ctrl-C stops everything.
""", flush=True)

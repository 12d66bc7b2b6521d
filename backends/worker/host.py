"""Run one PyTorch worker: load the model, measure it, serve it, join the fleet through Redis.

Example::

    config = WorkerConfig(model_path=None, served_model_name="SmolLM2-135M-Instruct",
                          device="cpu", port=8000, redis_url="redis://127.0.0.1:6379")
    asyncio.run(run_worker(config))     # until SIGTERM / SIGINT
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from aiohttp import web

from backends.publisher import KvPublisher, WorkerIdentity
from backends.redis_url import redis_from_url
from backends.worker.async_engine import AsyncEngine
from backends.worker.engine import EngineConfig, LLMEngine
from backends.worker.kv_cache import available_memory_bytes
from backends.worker.model import LlamaModel
from backends.worker.server import create_app, start_server

log = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True, slots=True)
class WorkerConfig:
    """One worker's settings; `backends.worker.cli` builds it from the command line.
    ``model_path`` None is the bundled SmolLM2-135M-Instruct GGUF; ``dtype`` None is float32
    on CPU, bfloat16 on CUDA."""

    model_path: Path | None
    served_model_name: str
    worker_id: str = "worker-0"
    device: str = "auto"
    dtype: str | None = None
    host: str = "127.0.0.1"
    port: int = 8000
    redis_url: str | None = None
    engine: EngineConfig = field(default_factory=EngineConfig)
    num_threads: int | None = None
    prefill_probe_tokens: int = 256
    heartbeat_interval_s: float = 1.0
    drain_timeout_s: float = 10.0

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"


def load_engine(config: WorkerConfig) -> LLMEngine:
    if config.num_threads is not None:
        torch.set_num_threads(config.num_threads)
    engine_config = replace(config.engine, model_name=config.served_model_name)
    return LLMEngine.from_path(config.model_path, device=config.device,
                               dtype=DTYPES[config.dtype] if config.dtype else None,
                               config=engine_config)


@torch.inference_mode()
def measure_prefill_tokens_per_s(model: LlamaModel, num_tokens: int) -> float:
    """Prefill speed of one ``num_tokens`` prompt (the second of two runs: the first warms
    the kernels up, which the first real request would otherwise pay for)."""
    num_tokens = max(1, min(num_tokens, model.config.max_position_embeddings))
    positions = torch.arange(num_tokens, device=model.device)[None]
    input_ids = positions % model.config.vocab_size
    elapsed_s = 0.0
    for _ in range(2):
        started_s = time.perf_counter()
        model.compute_logits(model(input_ids, positions)[:, -1:])
        if model.device.type == "cuda":
            torch.cuda.synchronize(model.device)
        elapsed_s = time.perf_counter() - started_s
    return num_tokens / elapsed_s


def resource_profile(engine: LLMEngine, *, prefill_tokens_per_s: float | None) -> dict[str, Any]:
    """The heartbeat's ``profile``: the keys of the simulated worker's, and what is measured
    here (device, memory, KV dtype and bytes)."""
    device = engine.device
    if device.type == "cuda":
        properties = torch.cuda.get_device_properties(device)
        device_name, memory_bytes = properties.name, properties.total_memory
    else:
        device_name, memory_bytes = "cpu", _total_ram_bytes(device)
    manager, scheduler, spec = engine.block_manager, engine.scheduler, engine.kv_spec
    profile: dict[str, Any] = {
        "model": engine.config.model_name,
        "engine": "switchyard-worker",
        "device": device.type,
        "device_name": device_name,
        "device_memory_bytes": memory_bytes,
        "dtype": str(engine.model.dtype).removeprefix("torch."),
        "model_bytes": sum(p.numel() * p.element_size() for p in engine.model.parameters()),
        "kv_dtype": spec.kv_dtype,
        "kv_bytes_per_token": spec.bytes_per_token,
        "kv_cache_bytes": engine.kv_cache.num_bytes,
        "num_kv_blocks": manager.num_blocks,
        "block_size": manager.block_size,
        "kv_capacity_tokens": manager.num_blocks * manager.block_size,
        "max_batch": scheduler.max_batch,
        "max_num_batched_tokens": scheduler.max_num_batched_tokens,
        "max_context_tokens": scheduler.max_context_tokens,
        "kv_watermark_frac": manager.watermark_blocks / manager.num_blocks,
    }
    if prefill_tokens_per_s is not None:
        profile["prefill_tokens_per_s"] = round(prefill_tokens_per_s, 1)
    return profile


def _total_ram_bytes(device: torch.device) -> int:
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return available_memory_bytes(device)


async def start_worker(config: WorkerConfig) -> tuple[web.AppRunner, AsyncEngine]:
    """Load, measure and serve; the runner's cleanup stops it all."""
    engine = load_engine(config)  # nothing else runs yet: blocking the loop is fine
    prefill_tokens_per_s = None
    if config.prefill_probe_tokens > 0:
        prefill_tokens_per_s = measure_prefill_tokens_per_s(engine.model,
                                                            config.prefill_probe_tokens)
    profile = resource_profile(engine, prefill_tokens_per_s=prefill_tokens_per_s)
    redis = redis_from_url(config.redis_url) if config.redis_url else None
    publisher = None
    if redis is not None:
        publisher = KvPublisher(
            redis,
            WorkerIdentity(config.worker_id, config.url, (config.served_model_name,), profile),
            heartbeat_interval_s=config.heartbeat_interval_s)
    async_engine = AsyncEngine(engine, worker_id=config.worker_id, publisher=publisher)
    app = create_app(async_engine, model_name=config.served_model_name, profile=profile)
    if redis is not None:
        app.on_cleanup.append(lambda _: redis.aclose())  # after the app left the fleet
    runner = await start_server(app, config.host, config.port,
                                shutdown_timeout_s=config.drain_timeout_s)
    return runner, async_engine


async def run_worker(config: WorkerConfig) -> None:
    if config.host in ("0.0.0.0", "::", "") and config.redis_url:
        log.warning("--host %s is advertised to gateways as %s, which they cannot reach; "
                    "give this machine's address or name", config.host, config.url)
    runner, engine = await start_worker(config)
    inner = engine.engine
    print(f"switchyard worker {config.worker_id}: serving {config.served_model_name!r} on "
          f"{config.url} ({inner.device}, {str(inner.model.dtype).removeprefix('torch.')}, "
          f"{inner.block_manager.num_blocks} KV blocks of {inner.block_manager.block_size} "
          f"tokens in {inner.kv_spec.kv_dtype})"
          + (f", heartbeat to {config.redis_url}" if config.redis_url else ""), flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    try:
        await stop.wait()
    finally:
        await runner.cleanup()

"""Host a fleet of simulated workers in one process: one port and one ``SimWorker`` each.

Example::

    config = SimFleetConfig(num_workers=8, base_port=19001, redis_url="redis://127.0.0.1:6379")
    asyncio.run(run_fleet(config))        # until SIGTERM / SIGINT
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO, Any

from aiohttp import web

from backends.publisher import KvPublisher, WorkerIdentity
from backends.redis_url import redis_from_url
from backends.sim.profile import LatencyModel, WorkerProfile
from backends.sim.server import create_app
from backends.sim.worker import SimWorker
from backends.tokenizer import TokenizerKind, get_tokenizer

log = logging.getLogger(__name__)

DEFAULT_SIM_MODEL = "switchyard-sim"


@dataclass(frozen=True, slots=True)
class SimFleetConfig:
    num_workers: int = 4
    base_port: int = 19001
    host: str = "127.0.0.1"
    model: str = DEFAULT_SIM_MODEL
    tokenizer: TokenizerKind = "real"
    redis_url: str | None = None
    seed: int = 0
    jitter_frac: float = 0.0
    base_profile: dict[str, Any] = field(default_factory=dict)
    latency: LatencyModel = field(default_factory=LatencyModel)
    per_worker: tuple[dict[str, Any], ...] = ()  # overrides for worker i (heterogeneous fleets)
    worker_id_prefix: str = "sim"
    heartbeat_interval_s: float = 1.0
    # Append one JSON line per request to this file: its engine phases (``server.phases_line``).
    request_log: Path | None = None


def worker_profiles(config: SimFleetConfig) -> list[WorkerProfile]:
    base = WorkerProfile(model=config.model, latency=config.latency)
    if config.base_profile:
        base = replace(base, **config.base_profile)
    profiles = []
    for index in range(config.num_workers):
        overrides = config.per_worker[index] if index < len(config.per_worker) else {}
        profiles.append(replace(base, **overrides) if overrides else base)
    return profiles


async def start_fleet(
    config: SimFleetConfig, request_log: IO[str] | None = None,
) -> tuple[list[SimWorker], list[web.AppRunner], list[asyncio.Task[None]], list[KvPublisher]]:
    """Start the workers' engines and HTTP servers; ``request_log`` (an open text file) gets
    every worker's request lines."""
    tokenizer = get_tokenizer(config.tokenizer)
    redis = redis_from_url(config.redis_url) if config.redis_url else None
    workers, runners, tasks, publishers = [], [], [], []
    for index, profile in enumerate(worker_profiles(config)):
        port = config.base_port + index
        worker_id = f"{config.worker_id_prefix}-{port}"
        publisher = None
        if redis is not None:
            publisher = KvPublisher(
                redis,
                WorkerIdentity(worker_id, f"http://{config.host}:{port}", (profile.model,),
                               profile.to_json()),
                heartbeat_interval_s=config.heartbeat_interval_s,
            )
            publishers.append(publisher)
        worker = SimWorker(worker_id, profile, publisher=publisher,
                           jitter_frac=config.jitter_frac, seed=config.seed + index)
        runner = web.AppRunner(create_app(worker, tokenizer, request_log),
                               handler_cancellation=True, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, config.host, port, reuse_address=True).start()
        tasks.append(asyncio.create_task(worker.run(), name=f"{worker_id}-engine"))
        if publisher is not None:
            tasks.append(asyncio.create_task(
                publisher.run(worker.load, worker.resident_hashes), name=f"{worker_id}-publisher"))
        workers.append(worker)
        runners.append(runner)
    return workers, runners, tasks, publishers


async def run_fleet(config: SimFleetConfig) -> None:
    with contextlib.ExitStack() as files:
        request_log = None
        if config.request_log is not None:
            request_log = files.enter_context(config.request_log.open("a", buffering=1))
        await _serve_fleet(config, request_log)


async def _serve_fleet(config: SimFleetConfig, request_log: IO[str] | None) -> None:
    workers, runners, tasks, publishers = await start_fleet(config, request_log)
    last = config.base_port + len(workers) - 1
    print(f"switchyard sim: {len(workers)} workers serving {config.model!r} on "
          f"http://{config.host}:{config.base_port}..{last}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    try:
        await stop.wait()
    finally:
        for publisher in publishers:
            await publisher.withdraw()
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for runner in runners:
            await runner.cleanup()

"""Load driver of the simulator accuracy benchmark; `bench.sim_accuracy.bench` runs it in its
own process.

Keeps ``--concurrency`` streaming ``/v1/completions`` requests in flight to each of ``--workers``
simulated workers (ports ``--base-port`` + i) in a closed loop for ``--duration`` seconds, then
lets the last ones finish. Prompts are token ids from `bench.sim_accuracy.model.request_shape`.
Per request it records, on this process's ``time.monotonic()`` clock: the worker, the request's
index, when it was sent, when the first token and the last token were read, and how many tokens
came. Around the measured phase it also reads each worker's ``/sim/profile`` (steps, lateness)
and the CPU seconds of the simulator process, of itself and of the whole machine::

    python -m bench.sim_accuracy.client --base-port 19001 --workers 8 --sim-pid 1234 --out r.json

Each stream slot owns one keep-alive connection, read by `bench.sim_accuracy.stream`: on a
2-core machine a full HTTP client would take CPU from the simulator under test.
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import uvloop

from bench.common.procstat import busy_cpu_seconds, cpu_seconds
from bench.sim_accuracy.model import request_shape
from bench.sim_accuracy.stream import StreamConnection, open_stream_connection

# SSE events of a completion stream that carry no token: the finish event and "[DONE]".
NUM_TRAILING_EVENTS = 2
HOST = "127.0.0.1"
WORKER_START_SPACING_S = 0.003


@dataclass(slots=True)
class Driver:
    base_port: int
    num_workers: int
    concurrency: int
    seed: int
    model: str
    records: list[list[float]] = field(default_factory=list)
    _next_index: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._next_index = [0] * self.num_workers

    async def closed_loop(self, connection: StreamConnection, worker: int, slot: int,
                          deadline_s: float, started: list[asyncio.Event]) -> None:
        """One stream slot. Slot k starts once slot k-1 has its first token, so every
        request reaches its worker just after a step boundary, as later ones do: arrivals at
        the same instant would leave the order in which the worker saw them to chance, and
        the replay would batch them differently."""
        if slot:
            await started[slot - 1].wait()
        else:
            # Workers start one by one, too: arrivals in one burst would be parsed one after
            # the other, and each worker's step clock would start that much late for good.
            await asyncio.sleep(worker * WORKER_START_SPACING_S)
        first_token: asyncio.Event | None = started[slot]
        try:
            while time.monotonic() < deadline_s:
                index = self._next_index[worker]
                self._next_index[worker] += 1
                prompt_ids, max_tokens = request_shape(self.seed, worker, index)
                body = orjson.dumps({"model": self.model, "prompt": prompt_ids,
                                     "max_tokens": max_tokens, "stream": True})
                stream = await connection.stream("/v1/completions", body, first_token)
                first_token = None
                self.records.append([worker, index, len(prompt_ids), max_tokens, stream.send_s,
                                     stream.first_event_s, stream.last_event_s,
                                     stream.num_events - NUM_TRAILING_EVENTS])
        finally:
            started[slot].set()  # even if it never sent: later slots must not wait forever

    async def connect(self) -> list[list[StreamConnection]]:
        """One warm connection per stream slot; the workers are idle again after this."""
        body = orjson.dumps({"model": self.model, "prompt": [1, 2, 3], "max_tokens": 1,
                             "stream": True})
        connections = [[await open_stream_connection(HOST, self.base_port + worker)
                        for _ in range(self.concurrency)] for worker in range(self.num_workers)]
        await asyncio.gather(*(c.stream("/v1/completions", body)
                               for row in connections for c in row))
        return connections

    async def profiles(self, session: aiohttp.ClientSession) -> list[dict[str, Any]]:
        async def one(worker: int) -> dict[str, Any]:
            url = f"http://{HOST}:{self.base_port + worker}/sim/profile"
            async with session.get(url) as resp:
                body: dict[str, Any] = orjson.loads(await resp.read())
                return body
        return list(await asyncio.gather(*(one(w) for w in range(self.num_workers))))


def _own_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def drive(driver: Driver, duration_s: float, sim_pid: int) -> dict[str, Any]:
    async with aiohttp.ClientSession() as session:
        connections = await driver.connect()
        await asyncio.sleep(0.2)
        profiles_before = await driver.profiles(session)
        sim_before, own_before, machine_before = (cpu_seconds(sim_pid), _own_cpu_s(),
                                                  busy_cpu_seconds())
        started_s = time.monotonic()
        started = [[asyncio.Event() for _ in range(driver.concurrency)]
                   for _ in range(driver.num_workers)]
        await asyncio.gather(*(
            driver.closed_loop(connection, worker, slot, started_s + duration_s, started[worker])
            for worker, row in enumerate(connections) for slot, connection in enumerate(row)))
        elapsed_s = time.monotonic() - started_s
        sim_cpu_s, own_cpu_s = cpu_seconds(sim_pid) - sim_before, _own_cpu_s() - own_before
        machine_cpu_s = busy_cpu_seconds() - machine_before
        profiles_after = await driver.profiles(session)
    for row in connections:
        for connection in row:
            connection.close()
    return {
        "started_s": started_s, "elapsed_s": elapsed_s, "requests": driver.records,
        "cpu_s": {"sim": sim_cpu_s, "client": own_cpu_s}, "machine_busy_cpu_s": machine_cpu_s,
        "profiles_before": profiles_before, "profiles_after": profiles_after,
    }


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.sim_accuracy.client",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base-port", type=int, required=True)
    parser.add_argument("--workers", type=int, required=True)
    parser.add_argument("--concurrency", type=int, default=16, help="streams per worker")
    parser.add_argument("--duration", type=float, default=10.0, help="seconds of new requests")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--model", default="switchyard-sim")
    parser.add_argument("--sim-pid", type=int, required=True, help="charge CPU to this process")
    parser.add_argument("--out", type=Path, required=True, help="write the JSON result here")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    driver = Driver(args.base_port, args.workers, args.concurrency, args.seed, args.model)
    result: dict[str, Any] = uvloop.run(drive(driver, args.duration, args.sim_pid))
    args.out.write_bytes(orjson.dumps(result))
    return 0 if result["requests"] else 1


if __name__ == "__main__":
    sys.exit(main())

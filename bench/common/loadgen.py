"""A small HTTP load generator: closed loop (fixed concurrency) or open loop (fixed arrival rate).

Run it in its own process, so its CPU is not charged to the server under test::

    python -m bench.common.loadgen --url http://127.0.0.1:8080/v1/chat/completions --key sy-... \\
        --mode open --rate 200 --duration 10 --json

``--watch NAME=PID`` (repeatable) also reports the CPU seconds each watched process used during
the measured phase only: after the warm-up, until the last response has been read.

Latency runs from the moment a request is sent until its whole body (or stream) has been read.
In open mode arrivals are scheduled up front (Poisson or uniform, from ``--seed``), requests are
never held back by slow responses, and ``lags_ms`` records how late each one left.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import resource
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Literal

import aiohttp
import orjson
import uvloop

from bench.common.procstat import busy_cpu_seconds, cpu_seconds_of
from bench.common.stats import percentile

Mode = Literal["closed", "open"]
Arrivals = Literal["poisson", "uniform"]
PROMPT = "Say hello to the benchmark."


@dataclass(frozen=True, slots=True)
class LoadSpec:
    """What to send and how hard.

    Example::

        spec = LoadSpec(url=url, body=chat_body("m", 16), headers=json_headers(key),
                        mode="closed", concurrency=32, num_requests=5000)
        result = asyncio.run(run_load(spec))
    """

    url: str
    body: bytes
    headers: dict[str, str]
    mode: Mode = "closed"
    concurrency: int = 32
    num_requests: int | None = None  # closed loop: stop after this many (or at duration_s)
    duration_s: float = 10.0  # closed loop: the upper bound; open loop: how long to send for
    rate_per_s: float = 200.0
    arrivals: Arrivals = "poisson"
    is_stream: bool = False
    num_warmup: int = 0  # closed-loop requests first, not measured (connections, caches)
    seed: int = 1
    watch: dict[str, int] = field(default_factory=dict)


@dataclass(slots=True)
class LoadResult:
    num_ok: int = 0
    num_errors: int = 0
    num_events: int = 0  # SSE "data:" events read, streams only
    elapsed_s: float = 0.0
    latencies_ms: list[float] = field(default_factory=list)
    lags_ms: list[float] = field(default_factory=list)
    cpu_s: dict[str, float] = field(default_factory=dict)
    machine_busy_cpu_s: float = 0.0  # every process on the machine, for spotting noise
    first_error: str = ""

    def record_error(self, reason: str) -> None:
        self.num_errors += 1
        self.first_error = self.first_error or reason

    def to_json(self) -> dict[str, Any]:
        lat = self.latencies_ms
        return {
            "num_ok": self.num_ok,
            "num_errors": self.num_errors,
            "num_events": self.num_events,
            "elapsed_s": self.elapsed_s,
            "requests_per_s": self.num_ok / self.elapsed_s if self.elapsed_s else 0.0,
            "p50_ms": percentile(lat, 0.50),
            "p99_ms": percentile(lat, 0.99),
            "lag_p99_ms": percentile(self.lags_ms, 0.99) if self.lags_ms else 0.0,
            "cpu_s": self.cpu_s,
            "machine_busy_cpu_s": self.machine_busy_cpu_s,
            "first_error": self.first_error,
            "latencies_ms": [round(x, 4) for x in lat],
        }


APIS = ("chat", "messages", "responses")  # /v1/chat/completions, /v1/messages, /v1/responses


def chat_body(model: str, max_tokens: int, *, is_stream: bool = False,
              token_delay_ms: float | None = None, api: str = "chat") -> bytes:
    """A chat request (``api``: the same prompt as an Anthropic Messages or an OpenAI
    Responses request); ``token_delay_ms`` paces the mock engine (its per-request control)."""
    body: dict[str, Any] = {"model": model, "stream": is_stream}
    if api == "responses":
        body |= {"input": PROMPT, "max_output_tokens": max_tokens}
    else:
        body |= {"messages": [{"role": "user", "content": PROMPT}], "max_tokens": max_tokens}
    if token_delay_ms is not None:
        body["mock"] = {"token_delay_ms": token_delay_ms}
    return orjson.dumps(body)


def json_headers(api_key: str | None) -> dict[str, str]:
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    return headers


class _Client:
    def __init__(self, session: aiohttp.ClientSession, spec: LoadSpec) -> None:
        self._session = session
        self._spec = spec

    async def send(self, result: LoadResult, sent_at: float) -> None:
        spec = self._spec
        num_events = 0
        try:
            async with self._session.post(spec.url, data=spec.body, headers=spec.headers) as resp:
                if spec.is_stream:
                    async for chunk in resp.content.iter_any():
                        num_events += chunk.count(b"data:")
                else:
                    await resp.read()
                status = resp.status
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            result.record_error(f"{exc.__class__.__name__}: {exc}")
            return
        if status != 200:
            result.record_error(f"HTTP {status}")
            return
        result.latencies_ms.append((time.perf_counter() - sent_at) * 1000)
        result.num_ok += 1
        result.num_events += num_events


async def _closed_loop(client: _Client, result: LoadResult, concurrency: int,
                       num_requests: int | None, deadline: float) -> None:
    remaining = num_requests if num_requests is not None else sys.maxsize

    async def worker() -> None:
        nonlocal remaining
        while remaining > 0 and time.perf_counter() < deadline:
            remaining -= 1
            await client.send(result, time.perf_counter())

    await asyncio.gather(*(worker() for _ in range(concurrency)))


async def _open_loop(client: _Client, result: LoadResult, spec: LoadSpec) -> None:
    rng = random.Random(spec.seed)
    tasks: set[asyncio.Task[None]] = set()
    started = time.perf_counter()
    offset_s = 0.0
    while offset_s < spec.duration_s:
        delay_s = started + offset_s - time.perf_counter()
        if delay_s > 0:
            await asyncio.sleep(delay_s)
        now = time.perf_counter()
        result.lags_ms.append((now - started - offset_s) * 1000)
        task = asyncio.create_task(client.send(result, now))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
        if spec.arrivals == "poisson":
            offset_s += rng.expovariate(spec.rate_per_s)
        else:
            offset_s += 1 / spec.rate_per_s
    if tasks:
        await asyncio.gather(*tasks)


def _own_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def run_load(spec: LoadSpec) -> LoadResult:
    """Warm up, then run the measured phase; returns its latencies, counts and CPU deltas."""
    limit = spec.concurrency if spec.mode == "closed" else 0
    connector = aiohttp.TCPConnector(limit=limit, keepalive_timeout=60)
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout,
                                     skip_auto_headers=("User-Agent",)) as session:
        client = _Client(session, spec)
        if spec.num_warmup:
            warmup = LoadResult()
            await _closed_loop(client, warmup, min(spec.concurrency, spec.num_warmup),
                               spec.num_warmup, time.perf_counter() + 30)
            if warmup.num_ok == 0:
                raise RuntimeError(f"every warm-up request failed: {warmup.first_error}")
        result = LoadResult()
        watched_before = cpu_seconds_of(spec.watch)
        own_before = _own_cpu_s()
        machine_before = busy_cpu_seconds()
        started = time.perf_counter()
        if spec.mode == "closed":
            await _closed_loop(client, result, spec.concurrency, spec.num_requests,
                               started + spec.duration_s)
        else:
            await _open_loop(client, result, spec)
        result.elapsed_s = time.perf_counter() - started
        watched_after = cpu_seconds_of(spec.watch)
        result.cpu_s = {name: watched_after[name] - watched_before[name] for name in spec.watch}
        result.cpu_s["loadgen"] = _own_cpu_s() - own_before
        result.machine_busy_cpu_s = busy_cpu_seconds() - machine_before
    return result


def _parse_watch(items: list[str]) -> dict[str, int]:
    watch: dict[str, int] = {}
    for item in items:
        name, sep, pid = item.partition("=")
        if not sep or not pid.isdigit():
            raise SystemExit(f"--watch takes NAME=PID, not {item!r}")
        watch[name] = int(pid)
    return watch


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.common.loadgen", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", required=True, help="the chat completions URL (or the "
                        "Messages or Responses one, with --api)")
    parser.add_argument("--api", choices=APIS, default="chat", help="the body's API")
    parser.add_argument("--key", help="API key sent as 'Authorization: Bearer KEY'")
    parser.add_argument("--model", default="switchyard-mock")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--stream", action="store_true", help="ask for SSE streams")
    parser.add_argument("--token-delay-ms", type=float, help="mock engines only: pace tokens")
    parser.add_argument("--mode", choices=("closed", "open"), default="closed")
    parser.add_argument("--concurrency", type=int, default=32, help="closed loop: in flight")
    parser.add_argument("--requests", type=int, help="closed loop: measured requests")
    parser.add_argument("--duration", type=float, default=10.0, help="seconds (an upper bound "
                        "in closed mode)")
    parser.add_argument("--rate", type=float, default=200.0, help="open loop: requests/s")
    parser.add_argument("--arrivals", choices=("poisson", "uniform"), default="poisson")
    parser.add_argument("--warmup", type=int, default=0, help="unmeasured requests first")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--watch", action="append", default=[], metavar="NAME=PID")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    spec = LoadSpec(
        url=args.url, body=chat_body(args.model, args.max_tokens, is_stream=args.stream,
                                     token_delay_ms=args.token_delay_ms, api=args.api),
        headers=json_headers(args.key), mode=args.mode, concurrency=args.concurrency,
        num_requests=args.requests, duration_s=args.duration, rate_per_s=args.rate,
        arrivals=args.arrivals, is_stream=args.stream, num_warmup=args.warmup, seed=args.seed,
        watch=_parse_watch(args.watch),
    )
    result: LoadResult = uvloop.run(run_load(spec))
    summary = result.to_json()
    if args.json:
        # The event loop may leave stdout non-blocking; a pipe then takes only 64-128 KiB.
        sys.stdout.flush()
        fd = sys.stdout.fileno()
        os.set_blocking(fd, True)
        view = memoryview(orjson.dumps(summary) + b"\n")
        while view:  # os.write may take only part of it
            view = view[os.write(fd, view):]
    else:
        cpu = ", ".join(f"{k} {v:.3f} s" for k, v in result.cpu_s.items())
        print(f"{result.num_ok} ok, {result.num_errors} errors in {result.elapsed_s:.2f} s "
              f"({summary['requests_per_s']:.0f}/s); p50 {summary['p50_ms']:.3f} ms, "
              f"p99 {summary['p99_ms']:.3f} ms; cpu: {cpu}")
        if result.first_error:
            print(f"first error: {result.first_error}")
    return 0 if result.num_ok else 1


if __name__ == "__main__":
    sys.exit(main())

"""Steady load for the fault scenarios, every request's fate recorded.

Poisson arrivals (seeded) at ``rate_per_s``: ``stream_share`` of them short chat streams of
``stream_tokens`` tokens, the rest non-streaming requests of ``body_tokens``; each prompt is
different, so prefix affinity pins nothing. Every request becomes one `Outcome`:

- ``ok``: 200, and a stream that ended with ``data: [DONE]`` (a body that parses);
- ``failed``: no 200 head reached the client (an error status, or a connection that failed
  before any byte);
- ``cut_error_event``: a 200 stream that ended with an SSE error event instead of [DONE];
- ``cut_silent``: a 200 stream or body that ended with neither (the client cannot tell why).

The load stops at ``stop`` or after ``max_duration_s``, whichever is first, so it sends at
most ``rate_per_s * max_duration_s`` (and a little, Poisson) requests, each bounded by
``request_timeout_s``. Example::

    load = SteadyLoad(session, origin, key, LoadShape())
    task = asyncio.create_task(load.run(stop, max_duration_s=30))
    ...
    stop.set()
    outcomes = await task
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import asdict, dataclass
from typing import Any, Literal

import aiohttp
import orjson

from gateway.cli.localfleet import SIM_MODEL

Kind = Literal["ok", "failed", "cut_error_event", "cut_silent"]
_WORDS = ("gateway", "breaker", "probe", "stream", "worker", "lease", "quota", "redis",
          "token", "heartbeat", "fleet", "retry", "backend", "route", "prefix", "cache")


@dataclass(frozen=True, slots=True)
class LoadShape:
    rate_per_s: float = 20.0
    stream_share: float = 0.8
    stream_tokens: int = 32
    body_tokens: int = 16
    request_timeout_s: float = 60.0
    seed: int = 1


@dataclass(slots=True)
class Outcome:
    index: int
    is_stream: bool
    sent_s: float  # monotonic, like every time here
    head_s: float | None = None
    end_s: float = 0.0
    status: int = 0  # 0: no response head came
    code: str = ""  # the error code of a non-200 body or of a stream's error event
    backend: str = ""  # x-switchyard-backend
    num_events: int = 0  # SSE data events before the end, [DONE] not counted
    kind: Kind = "failed"
    detail: str = ""

    @property
    def latency_s(self) -> float:
        return self.end_s - self.sent_s

    def was_in_flight_at(self, t_s: float) -> bool:
        return self.sent_s <= t_s < self.end_s

    def to_json(self, t0_s: float) -> dict[str, Any]:
        row = asdict(self)
        for name in ("sent_s", "head_s", "end_s"):
            if row[name] is not None:
                row[name] = round(row[name] - t0_s, 4)
        return row


def _error_code(raw: bytes) -> str:
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return "not_json"
    error = doc.get("error") if isinstance(doc, dict) else None
    if not isinstance(error, dict):
        return ""
    return str(error.get("code") or error.get("type") or "error")


class SteadyLoad:
    """Requests from one key at a steady Poisson rate; `run` returns their outcomes."""

    def __init__(self, session: aiohttp.ClientSession, origin: str, api_key: str,
                 shape: LoadShape, model: str = SIM_MODEL) -> None:
        self._session = session
        self._url = origin + "/v1/chat/completions"
        self._headers = {"Authorization": f"Bearer {api_key}",
                         "Content-Type": "application/json"}
        self._shape = shape
        self._model = model
        self._rng = random.Random(shape.seed)
        self._timeout = aiohttp.ClientTimeout(total=shape.request_timeout_s)
        self.outcomes: list[Outcome] = []

    def _body(self, index: int, is_stream: bool) -> bytes:
        words = " ".join(self._rng.choice(_WORDS) for _ in range(20))
        shape = self._shape
        return orjson.dumps({
            "model": self._model, "stream": is_stream,
            "max_tokens": shape.stream_tokens if is_stream else shape.body_tokens,
            "messages": [{"role": "user", "content": f"Fault bench request {index}: {words}"}],
        })

    async def run(self, stop: asyncio.Event, max_duration_s: float) -> list[Outcome]:
        shape = self._shape
        tasks: set[asyncio.Task[None]] = set()
        started_s = time.monotonic()
        next_s = started_s
        index = 0
        while not stop.is_set() and next_s < started_s + max_duration_s:
            delay_s = next_s - time.monotonic()
            if delay_s > 0:
                try:
                    await asyncio.wait_for(stop.wait(), delay_s)
                    break
                except TimeoutError:
                    pass
            is_stream = self._rng.random() < shape.stream_share
            outcome = Outcome(index, is_stream, time.monotonic())
            self.outcomes.append(outcome)
            task = asyncio.create_task(self._send(outcome, self._body(index, is_stream)))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            index += 1
            next_s += self._rng.expovariate(shape.rate_per_s)
        if tasks:
            await asyncio.gather(*tasks)
        return self.outcomes

    async def _send(self, outcome: Outcome, body: bytes) -> None:
        error_code = ""
        has_done = False
        try:
            async with self._session.post(self._url, data=body, headers=self._headers,
                                          timeout=self._timeout) as resp:
                outcome.head_s = time.monotonic()
                outcome.status = resp.status
                outcome.backend = resp.headers.get("x-switchyard-backend", "")
                if resp.status != 200:
                    outcome.code = _error_code(await resp.read())
                elif outcome.is_stream:
                    async for line in resp.content:
                        if not line.startswith(b"data: "):
                            continue
                        payload = line[6:].strip()
                        if payload == b"[DONE]":
                            has_done = True
                            continue
                        outcome.num_events += 1
                        if payload.startswith(b'{"error"'):
                            error_code = _error_code(payload)
                else:
                    raw = await resp.read()
                    try:
                        has_done = "choices" in orjson.loads(raw)
                    except orjson.JSONDecodeError:
                        outcome.detail = "a 200 body that is not JSON"
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            outcome.detail = f"{exc.__class__.__name__}: {exc}"[:300]
        outcome.end_s = time.monotonic()
        if outcome.status != 200:
            outcome.kind = "failed"
        elif error_code:
            outcome.kind, outcome.code = "cut_error_event", error_code
        else:
            outcome.kind = "ok" if has_done else "cut_silent"


def peak_in_flight(outcomes: list[Outcome]) -> int:
    """The most requests that were out at once."""
    edges = sorted([(o.sent_s, 1) for o in outcomes] + [(o.end_s, -1) for o in outcomes],
                   key=lambda edge: (edge[0], edge[1]))
    level = peak = 0
    for _, step in edges:
        level += step
        peak = max(peak, level)
    return peak

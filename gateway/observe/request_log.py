"""The request log: one JSON line per request, for "who sent what, how much, why it failed".

Off by default (``request_log.mode``); ``sampled`` writes a ``sample_rate`` share of the
successful requests and every failed one, ``all`` every request; to stdout or to ``path``
(appended, mode 0600). A line holds ids, never secrets or text: the request id, tenant, key id
(never the key), model, tier, backend, status, error code, prompt / cached / output tokens,
TTFT, total time, each wait's seconds and the wait that took longest; the prompt's text only with
``include_prompt``. Routed requests also say why their prompt was or was not cached:
``expected_cached_tokens``, what routing expected the chosen backend to hold of the prompt, and
``best_cached_tokens``, the most that any backend held by the prefix index then. Against
``cached_tokens`` (what the engine reported) a cache miss tells its cause: a backend chosen for
its load over a holder (expected below best), or a prefix the backend had evicted since the
index last heard (cached well below expected). With ``route_detail`` a routed line also holds
``route_candidates``: every backend of the snapshot the decision was made on, with what the
index matched of the prompt there (``cached_tokens``), its load figures and their age, so a
backend passed over can be told from one filtered out (stale, saturated) or outscored (a
backlog worth more than its cache). Example line::

    {"ts":"2026-12-03T08:50:01.123Z","request_id":"req-…","tenant":"acme","key_id":"k-…",
     "model":"m","tier":"standard","route":"chat","stream":true,"backend":"sim-0",
     "status":200,"error":null,"prompt_tokens":812,"cached_tokens":768,"output_tokens":40,
     "ttft_s":0.031,"total_s":0.42,"dominant_wait":"streaming",
     "waits":{"auth":0.0001,"quota":0.0002,"routing":0.0003,"upstream_ttft":0.029,…},
     "expected_cached_tokens":768,"best_cached_tokens":768}
"""

from __future__ import annotations

import os
import random
import sys
import time
from typing import IO, TYPE_CHECKING, Any, Literal

import orjson

from gateway.apis import API_OF_ROUTE
from gateway.router import prompt_text

if TYPE_CHECKING:  # the gateway's context holds a RequestLog: no import cycle at run time
    from gateway.auth import Principal
    from gateway.observe.telemetry import RequestTrace
    from gateway.router import RoutePlan

Mode = Literal["off", "sampled", "all"]


def request_record(request_id: str, trace: RequestTrace, started_s: float, status: int,
                   error: str | None, model: str | None, principal: Principal | None,
                   num_prompt_tokens: int | None, num_output_tokens: int | None
                   ) -> dict[str, Any]:
    """One request's line: ids and figures only, never the key or text. Prompt and cached
    tokens are the engine's usage when it reported one, else the gateway's count."""
    usage = API_OF_ROUTE[trace.route].cache_usage(trace.tail) if trace.tail else None
    prompt_tokens, cached_tokens = usage if usage is not None else (num_prompt_tokens, None)
    waits = trace.waits
    return {
        "request_id": request_id,
        "tenant": principal.tenant.id if principal is not None else None,
        "key_id": principal.key.id if principal is not None else None,
        "model": model, "tier": trace.tier, "route": trace.route, "stream": trace.is_stream,
        "backend": trace.backend, "status": status, "error": error,
        "prompt_tokens": prompt_tokens, "cached_tokens": cached_tokens,
        "output_tokens": num_output_tokens,
        "ttft_s": (round(trace.first_byte_s - started_s, 6)
                   if trace.first_byte_s is not None else None),
        "total_s": round(time.perf_counter() - started_s, 6),
        "dominant_wait": max(waits, key=waits.__getitem__) if waits else None,
        "waits": {wait: round(seconds, 6) for wait, seconds in waits.items()},
    }


def add_routing(record: dict[str, Any], plan: RoutePlan, *, is_detailed: bool = False) -> None:
    """What routing expected of a routed request's prompt cache (``expected_cached_tokens``
    on the chosen backend, ``best_cached_tokens`` on the best holder), and with
    ``is_detailed`` every backend of its snapshot (``route_candidates``) and, when it was sent
    on an approximate-index claim, the claim's age and that backend's claim lifetime then
    (``claim_age_s``, ``claim_ttl_s``); nothing for a request that was never routed."""
    snapshot = plan.snapshot
    if snapshot is None:
        return
    prefix = snapshot.prefix
    num_prompt_tokens = plan.request.num_prompt_tokens
    deepest = max(prefix.num_blocks.values(), default=0)
    record["expected_cached_tokens"] = min(plan.expected_cached_tokens, num_prompt_tokens)
    record["best_cached_tokens"] = min(deepest * prefix.block_tokens, num_prompt_tokens)
    if is_detailed:
        get_num_blocks = prefix.num_blocks.get
        record["route_candidates"] = [
            {"backend": b.name,
             "cached_tokens": min(get_num_blocks(b.name, 0) * prefix.block_tokens,
                                  num_prompt_tokens),
             "healthy": b.is_healthy, "age_s": round(b.age_s, 4), "running": b.num_running,
             "waiting": b.num_waiting, "in_flight": b.num_in_flight,
             "queued_prefill_tokens": b.num_queued_prefill_tokens,
             "in_flight_prompt_tokens": b.num_in_flight_prompt_tokens,
             "kv_usage": round(b.kv_usage, 4), "source": b.source}
            for b in snapshot.backends]
        if plan.claim_age_s is not None:  # sent on an approximate claim: its age, its lifetime
            record["claim_age_s"] = round(plan.claim_age_s, 3)
            record["claim_ttl_s"] = round(plan.claim_ttl_s or 0.0, 3)


class RequestLog:
    def __init__(self, mode: Mode = "off", sample_rate: float = 0.01, path: str | None = None,
                 *, rng: random.Random | None = None, include_prompt: bool = False,
                 prompt_max_chars: int = 2000, route_detail: bool = False) -> None:
        self.mode = mode
        self.route_detail = route_detail
        self.sample_rate = sample_rate
        self.include_prompt = include_prompt
        self.prompt_max_chars = prompt_max_chars
        self._rng = rng or random.Random()
        self._out: IO[bytes] | None = None
        if mode != "off":
            if path is None:
                self._out = sys.stdout.buffer
            else:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
                self._out = os.fdopen(fd, "ab", buffering=0)
        self.num_written = 0

    @property
    def is_on(self) -> bool:
        return self._out is not None

    def wants(self, status: int) -> bool:
        """Whether a request that ended with ``status`` is logged."""
        if self._out is None:
            return False
        return self.mode == "all" or status >= 400 or self._rng.random() < self.sample_rate

    def prompt_of(self, body: dict[str, Any] | None) -> str | None:
        """The prompt's text for the line, when ``include_prompt`` is on."""
        if not self.include_prompt or body is None:
            return None
        return prompt_text(body)[:self.prompt_max_chars]

    def write(self, record: dict[str, Any]) -> None:
        if self._out is None:
            return
        now = time.time()
        millis = int(now % 1 * 1000)
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{millis:03d}Z"
        try:
            self._out.write(orjson.dumps({"ts": stamp, **record}) + b"\n")
            self.num_written += 1
        except OSError:
            pass  # a full disk or a closed pipe must not fail the request

    def close(self) -> None:
        if self._out is not None and self._out is not sys.stdout.buffer:
            self._out.close()
        self._out = None

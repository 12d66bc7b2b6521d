"""What one simulated run measured: per-request records and their summary.

Definitions, over the requests after the warm-up (the first ``num_warmup`` by arrival, which
are simulated but not counted: a cold fleet's first requests all miss the cache):

- **TTFT** first token time minus arrival at the gateway; **TPOT** (finish - first token) /
  (output tokens - 1), for requests with more than one token; **e2e** finish minus arrival.
- **throughput** completed requests / (last finish - first arrival), both of counted ones.
- **cached fraction** sum of prompt tokens the engine found in its prefix cache at the
  admission that produced the first token (``Sequence.num_cached_tokens``, as the live
  worker reports ``cached_tokens``) / sum of prompt tokens.
- **ideal cached fraction** the same with one infinite cache that has seen every earlier
  request: a request's ideal hit is its longest run of leading full blocks whose chain hashes
  appeared in any earlier-arriving request's prompt (capped as the engine caps a hit, leaving
  at least one token to compute). **share of ideal** = cached / ideal.
- **missed** the share of requests that got under half their ideal hit (a prefix the fleet had
  seen that the chosen worker did not hold: a cold prefill), as ``bench/routing/figures.py``
  counts them live. Each costs a whole prefill, so the TTFT tail moves with this share once it
  nears the tail's percentile (at 1 %, the p99 jumps to the misses' TTFTs).
- **spread** max / mean over workers of requests routed (counted ones), and of busy time (the
  sum of the worker's step times), and of requests in flight (the sum of its requests' e2e
  times: by Little's law, its mean number of requests in flight, queued or running, times the
  span). Busy fractions are busy time / the whole run's span. A continuous-batching worker is
  busy whenever it holds one request, so at a moderate load every worker is busy ~100% of the
  time and busy spread says little; requests in flight show where the queues are.

Example::

    recorder = Recorder(num_requests=3, block_size=16)
    recorder.arrived(0, at_s=0.0, block_hashes=(...), num_prompt_tokens=40)
    ...
    result = summarize(recorder, ...)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from bench.common.stats import percentile
from bench.routing.figures import is_miss


class Recorder:
    """Per-request timings and token counts, by request index."""

    def __init__(self, num_requests: int, block_size: int) -> None:
        self.block_size = block_size
        nan = math.nan
        self.arrival_s = [nan] * num_requests
        self.first_token_s = [nan] * num_requests
        self.finish_s = [nan] * num_requests
        self.num_prompt_tokens = [0] * num_requests
        self.num_cached_tokens = [0] * num_requests
        self.num_ideal_tokens = [0] * num_requests
        self.num_output_tokens = [0] * num_requests
        self.worker = [-1] * num_requests  # -1: rejected
        self.group = [-1] * num_requests  # the request's shared prefix or conversation
        self._seen: set[int] = set()

    def arrived(self, index: int, at_s: float, block_hashes: Sequence[int],
                num_prompt_tokens: int) -> None:
        """A request arrived; its ideal hit is computed here, in arrival order."""
        self.arrival_s[index] = at_s
        self.num_prompt_tokens[index] = num_prompt_tokens
        seen = self._seen
        limit = min(len(block_hashes), (num_prompt_tokens - 1) // self.block_size)
        num_hit = 0
        while num_hit < limit and block_hashes[num_hit] in seen:
            num_hit += 1
        self.num_ideal_tokens[index] = num_hit * self.block_size
        seen.update(block_hashes)


@dataclass(frozen=True, slots=True)
class RunResult:
    """The summary of one run; ``to_dict`` for JSON. Times in seconds."""

    profile: str
    mode: str  # own or third-party (bench/common/fleet_modes.py)
    workload: str
    num_workers: int
    num_requests: int
    num_warmup: int  # the first requests, simulated but not counted
    rate_per_s: float
    kv_tokens_per_worker: int
    num_completed: int
    num_rejected: int
    ttft_p50_s: float
    ttft_p90_s: float
    ttft_p99_s: float
    tpot_p50_s: float
    tpot_p90_s: float
    e2e_p50_s: float
    e2e_p99_s: float
    throughput_rps: float
    output_tokens_per_s: float
    cached_fraction: float
    ideal_cached_fraction: float
    share_of_ideal: float
    missed_fraction: float
    requests_spread: float
    busy_spread: float
    in_flight_spread: float
    busy_mean_fraction: float
    busy_max_fraction: float
    num_preemptions: int
    virtual_s: float
    wall_s: float
    requests_per_wall_s: float
    num_replicas: int = 1  # gateway replicas behind a round-robin front
    is_sharing: bool = True  # they share the approximate index (always, with one)
    is_peer_load: bool = True  # they count each other's requests in flight (always, with one)
    # sy:approx flushes (pipelines, each a wake-up of every other replica) per request
    flushes_per_request: float = 0.0
    # Third-party: /metrics scrapes each engine answered a second, all replicas together
    scrapes_per_engine_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def spread(values: Sequence[float]) -> float:
    """max / mean; NaN when the mean is 0."""
    mean = sum(values) / len(values) if values else 0.0
    return max(values) / mean if mean > 0 else math.nan


def summarize(recorder: Recorder, *, profile: str, workload: str, rate_per_s: float,
              kv_tokens_per_worker: int, busy_s: Sequence[float], num_preemptions: int,
              wall_s: float, num_warmup: int = 0, mode: str = "own", num_replicas: int = 1,
              is_sharing: bool = True, is_peer_load: bool = True) -> RunResult:
    """The run's figures over requests ``num_warmup`` onwards (busy time over the whole run)."""
    arrival, first, finish = recorder.arrival_s, recorder.first_token_s, recorder.finish_s
    done = [i for i in range(num_warmup, len(finish)) if not math.isnan(finish[i])]
    outputs = recorder.num_output_tokens
    ttft = [first[i] - arrival[i] for i in done]
    e2e = [finish[i] - arrival[i] for i in done]
    tpot = [(finish[i] - first[i]) / (outputs[i] - 1) for i in done if outputs[i] > 1]
    arrived = [t for t in arrival[num_warmup:] if not math.isnan(t)]
    start_s = min(arrived, default=0.0)
    end_s = max((finish[i] for i in done), default=start_s)
    duration_s = end_s - start_s
    run_s = max((t for t in finish if not math.isnan(t)), default=0.0) - min(
        (t for t in arrival if not math.isnan(t)), default=0.0)
    num_prompt = sum(recorder.num_prompt_tokens[i] for i in done)
    num_cached = sum(recorder.num_cached_tokens[i] for i in done)
    num_ideal = sum(recorder.num_ideal_tokens[i] for i in done)
    cached_tokens, ideal_tokens = recorder.num_cached_tokens, recorder.num_ideal_tokens
    num_missed = sum(1 for i in done if is_miss(cached_tokens[i], ideal_tokens[i]))
    per_worker = [0] * len(busy_s)
    in_flight_s = [0.0] * len(busy_s)
    for i, e2e_s in zip(done, e2e, strict=True):
        per_worker[recorder.worker[i]] += 1
        in_flight_s[recorder.worker[i]] += e2e_s
    return RunResult(
        profile=profile, mode=mode, workload=workload, num_workers=len(busy_s),
        num_requests=len(arrival),
        num_warmup=num_warmup, rate_per_s=rate_per_s, kv_tokens_per_worker=kv_tokens_per_worker,
        num_completed=len(done), num_rejected=len(arrival) - num_warmup - len(done),
        ttft_p50_s=percentile(ttft, 0.5), ttft_p90_s=percentile(ttft, 0.9),
        ttft_p99_s=percentile(ttft, 0.99), tpot_p50_s=percentile(tpot, 0.5),
        tpot_p90_s=percentile(tpot, 0.9),
        e2e_p50_s=percentile(e2e, 0.5), e2e_p99_s=percentile(e2e, 0.99),
        throughput_rps=len(done) / duration_s if duration_s > 0 else math.nan,
        output_tokens_per_s=(sum(outputs[i] for i in done) / duration_s
                             if duration_s > 0 else math.nan),
        cached_fraction=num_cached / num_prompt if num_prompt else math.nan,
        ideal_cached_fraction=num_ideal / num_prompt if num_prompt else math.nan,
        share_of_ideal=num_cached / num_ideal if num_ideal else math.nan,
        missed_fraction=num_missed / len(done) if done else math.nan,
        requests_spread=spread(per_worker), busy_spread=spread(busy_s),
        in_flight_spread=spread(in_flight_s),
        busy_mean_fraction=sum(busy_s) / len(busy_s) / run_s if run_s > 0 else math.nan,
        busy_max_fraction=max(busy_s) / run_s if run_s > 0 else math.nan,
        num_preemptions=num_preemptions, virtual_s=duration_s, wall_s=wall_s,
        requests_per_wall_s=len(arrival) / wall_s if wall_s > 0 else math.nan,
        num_replicas=num_replicas, is_sharing=is_sharing, is_peer_load=is_peer_load,
    )

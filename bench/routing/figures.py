"""The figures of one routing run, from its records and the workers' counters: pure functions.

- **cached fraction**: cached / prompt tokens, both from each response's ``usage``;
- **ideal cached fraction**: what a perfect router with unlimited cache would get: each
  request's longest prefix seen in any earlier request (in sending order) is cached, in full
  16-token blocks and never the prompt's last token (the engine's rule), with the prompts
  tokenized as the simulated engine tokenizes them;
- **expected cached fraction**: what the router expected its picks to hold (the gateway's
  ``switchyard_routing_*`` counters; its prompt-token count is the gateway's estimate);
- **TTFT** p50/p90/p99, throughput, errors (``bench.run.summary``);
- **misses**: the requests that got under half of their ideal cached tokens (a prefix the
  fleet had seen but the chosen worker did not hold, or had evicted by admission): their
  share, and TTFT p50/p99 of those and of the others (hits);
- **load spread**: max / mean requests per worker (from ``x-switchyard-backend``), and where
  the most requested prefix group's requests went;
- **turns kept**: of the conversation turns after the first (multi-turn), the share served by
  the worker that served the conversation's previous turn (both answered);
- **busy time** per worker: the engine time its steps took, rebuilt from its counters with the
  sim's latency model (``backends.sim.profile``): ``(a * steps + b * prefilled tokens + c *
  decoded tokens + d * KV tokens attended) / speed``, where prefilled = prefix-cache queries -
  hits, and the KV attended is estimated per request (``prompt`` for its prefill, ``prompt + i``
  for its ``i``-th decode step). Busy fraction = busy time / the run's window. A batching
  engine with any request running is busy, so under load every worker's busy fraction nears 1;
  the **work** (busy time without the fixed per-step cost ``a``: what the requests' tokens
  cost) and the **requests in flight** (Little's law: the sum of its requests' end-to-end
  times / the window) show how the load is split.

Example::

    figures = run_figures(result.records, result.messages, result.counters, result.window_s,
                          worker_names=["sim-19001", "sim-19002"])
    figures["share_of_ideal"], figures["ttft_ms"]["p99"], figures["busy_max_mean"]
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from backends.sim.profile import LatencyModel
from backends.tokenizer import Tokenizer, get_tokenizer
from bench.run.spec import Message, Record
from bench.run.summary import group_stats, quantiles_ms
from bench.run.workers import max_over_mean
from routing.prefix import token_block_hashes

BLOCK_SIZE = 16
_MODEL = "ideal"  # any fixed chain seed: the ideal only compares prompts with each other


def ideal_cached_tokens(prompts: Sequence[Sequence[int]], block_size: int = BLOCK_SIZE
                        ) -> list[int]:
    """For each prompt (token ids, in sending order): tokens an unlimited shared cache would
    hold, i.e. its leading full blocks that an earlier prompt also had."""
    seen: set[int] = set()
    cached: list[int] = []
    for ids in prompts:
        hashes = token_block_hashes(ids, block_size, _MODEL)
        limit = min(len(hashes), max(0, (len(ids) - 1) // block_size))
        num_hit = 0
        while num_hit < limit and hashes[num_hit] in seen:
            num_hit += 1
        cached.append(num_hit * block_size)
        seen.update(hashes)
    return cached


def ideal_per_request(records: Sequence[Record], messages: Mapping[int, Sequence[Message]],
                      tokenizer: Tokenizer | None = None) -> dict[int, int]:
    """Each successful request's ideal cached tokens, by request index."""
    tokenizer = tokenizer or get_tokenizer("approx")
    ok = sorted((r for r in records if r.is_ok and r.num_prompt_tokens and r.index in messages),
                key=lambda r: r.sent_at_s)
    prompts = [tokenizer.encode_chat(messages[r.index]) for r in ok]
    return {r.index: cached for r, cached in zip(ok, ideal_cached_tokens(prompts), strict=True)}


def ideal_fraction(records: Sequence[Record], ideal: Mapping[int, int]) -> float | None:
    """The ideal cached-token fraction over ``records`` (those ``ideal`` covers)."""
    covered = [r for r in records if r.index in ideal]
    num_prompt = sum(r.num_prompt_tokens or 0 for r in covered)
    return sum(ideal[r.index] for r in covered) / num_prompt if num_prompt else None


def is_miss(num_cached_tokens: int, num_ideal_tokens: int) -> bool:
    """A request that got under half its ideal cached tokens (``bench.vsim`` counts the same)."""
    return num_cached_tokens < 0.5 * num_ideal_tokens


def miss_split(records: Sequence[Record], ideal: Mapping[int, int]) -> dict[str, Any]:
    """Requests with under half their ideal cached tokens (misses) against the rest (hits):
    the misses' share, and each side's TTFT p50 / p99 in ms."""
    judged = [r for r in records if r.index in ideal and r.ttft_s is not None]
    missed = [r for r in judged if is_miss(r.num_cached_tokens or 0, ideal[r.index])]
    hits = [r for r in judged if not is_miss(r.num_cached_tokens or 0, ideal[r.index])]

    def ttft(rs: Sequence[Record]) -> dict[str, float | None]:
        q = quantiles_ms([r.ttft_s for r in rs if r.ttft_s is not None])
        return {"p50": q["p50"], "p99": q["p99"]}

    return {"miss_share": len(missed) / len(judged) if judged else None,
            "num_missed": len(missed), "ttft_missed_ms": ttft(missed), "ttft_hit_ms": ttft(hits)}


def kv_tokens_attended(records: Sequence[Record]) -> float:
    """Estimated KV tokens the requests' steps attended: prefill, then each decode step."""
    total = 0.0
    for record in records:
        prompt, output = record.num_prompt_tokens or 0, record.num_completion_tokens or 0
        total += prompt + max(0, output - 1) * prompt + output * max(0, output - 1) / 2
    return total


def engine_time_s(counters: Mapping[str, float], kv_tokens: float, latency: LatencyModel,
                  speed_factor: float = 1.0) -> tuple[float, float]:
    """One worker's busy time (engine seconds in steps) and the requests' work in it (the same
    without the fixed per-step cost ``a``), from its counter deltas (module docstring)."""
    prefilled = max(0.0, counters["cache_query_tokens"] - counters["cache_hit_tokens"])
    work_s = (latency.b_s_per_token * prefilled
              + latency.c_s_per_seq * counters["generation_tokens"]
              + latency.d_s_per_kv_token * kv_tokens) / speed_factor
    return latency.a_s * counters["num_steps"] / speed_factor + work_s, work_s


def top_group(records: Sequence[Record], worker_names: Sequence[str]) -> dict[str, Any] | None:
    """The most requested prefix group: its share of the requests, and where they went."""
    ok = [r for r in records if r.is_ok and r.group is not None]
    if not ok:
        return None
    counts = Counter(r.group for r in ok)
    group, num = counts.most_common(1)[0]
    placed = Counter(r.worker for r in ok if r.group == group)
    return {"group": group, "share": num / len(ok),
            "requests_per_worker": {name: placed.get(name, 0) for name in worker_names}}


def turns_kept(records: Sequence[Record], all_records: Sequence[Record]) -> dict[str, Any]:
    """Of ``records``' later conversation turns, those on their previous turn's worker; the
    previous turn is looked up in ``all_records`` (it may be a warm-up request)."""
    served = {(r.conversation, r.turn): r.worker for r in all_records
              if r.is_ok and r.conversation is not None}
    judged = [(r.worker, served[(r.conversation, r.turn - 1)]) for r in records
              if r.is_ok and r.conversation is not None and r.turn > 0
              and (r.conversation, r.turn - 1) in served]
    num_kept = sum(worker == previous for worker, previous in judged)
    return {"num_turns": len(judged), "num_kept": num_kept,
            "share": num_kept / len(judged) if judged else None}


def run_figures(records: Sequence[Record], messages: Mapping[int, Sequence[Message]],
                counters: Mapping[str, Mapping[str, float]], window_s: float,
                worker_names: Sequence[str], routed: Mapping[str, float] | None = None,
                speed_factor: float = 1.0, warmup_s: float = 0.0,
                ideal_tokens: Mapping[int, int] | None = None) -> dict[str, Any]:
    """Every figure of one run (see the module docstring). Requests sent in the first
    ``warmup_s`` are warm-up: their prompts count as seen for the ideal, but the request
    figures (TTFT, cached, ideal, misses, requests per worker, throughput) leave them out;
    the engine-time and in-flight figures and the router's expectation cover the whole run.
    ``ideal_tokens``: `ideal_per_request` of the records, when the caller has it already."""
    if ideal_tokens is None:
        ideal_tokens = ideal_per_request(records, messages)
    all_records, records = records, [r for r in records if r.sent_at_s >= warmup_s]
    stats = group_stats(records, {}, window_s - warmup_s)
    ideal = ideal_fraction(records, ideal_tokens)
    cached = stats["cached_fraction"]
    ok = [r for r in records if r.is_ok]
    per_worker = {name: [r for r in ok if r.worker == name] for name in worker_names}
    num_unknown = sum(r.worker not in per_worker for r in ok)
    all_per_worker = {name: [r for r in all_records if r.is_ok and r.worker == name]
                      for name in worker_names}
    latency = LatencyModel()
    times = {name: engine_time_s(counters[name], kv_tokens_attended(all_per_worker[name]),
                                 latency, speed_factor)
             for name in worker_names if name in counters}
    busy = {name: t[0] for name, t in times.items()}
    work = {name: t[1] for name, t in times.items()}
    # Little's law: a worker's mean number of requests in flight over the run.
    in_flight = {name: sum(r.e2e_s or 0.0 for r in rs) / window_s if window_s else 0.0
                 for name, rs in all_per_worker.items()}
    num_requests = {name: len(rs) for name, rs in per_worker.items()}
    return {
        "num_requests": stats["num_requests"], "num_ok": stats["num_ok"],
        "num_errors": stats["num_errors"], "errors_by_status": stats["errors_by_status"],
        "warmup_s": warmup_s, "num_warmup": len(all_records) - len(records),
        "ttft_with_warmup_ms": quantiles_ms([r.ttft_s for r in all_records
                                             if r.is_ok and r.ttft_s is not None]),
        "ttft_ms": stats["ttft_ms"], "e2e_ms": stats["e2e_ms"], "tpot_ms": stats["tpot_ms"],
        "throughput_rps": stats["throughput_rps"],
        "output_tokens_per_s": stats["output_tokens_per_s"],
        "cached_fraction": cached, "ideal_cached_fraction": ideal,
        "share_of_ideal": cached / ideal if cached is not None and ideal else None,
        "expected_cached_fraction": (routed["expected_cached_tokens"] / routed["prompt_tokens"]
                                     if routed and routed.get("prompt_tokens") else None),
        "misses": miss_split(records, ideal_tokens),
        "top_group": top_group(records, worker_names),
        "turns_kept": turns_kept(records, all_records),
        "requests_per_worker": num_requests, "num_requests_unknown_worker": num_unknown,
        "max_mean_requests": max_over_mean(list(num_requests.values())),
        "busy_s_per_worker": busy,
        "busy_fraction_per_worker": {n: s / window_s for n, s in busy.items()} if window_s else {},
        "busy_max_mean": max_over_mean(list(busy.values())),
        "busy_s_per_request": (sum(busy.values()) / sum(map(len, all_per_worker.values()))
                               if ok else None),
        "work_s_per_worker": work, "work_max_mean": max_over_mean(list(work.values())),
        "in_flight_per_worker": in_flight,
        "in_flight_max_mean": max_over_mean(list(in_flight.values())),
        "num_steps_per_worker": {n: c["num_steps"] for n, c in counters.items()},
        "num_preemptions": sum(c["preemptions"] for c in counters.values()),
        "engine_lateness_s": sum(c["lateness_s"] for c in counters.values()),
        "window_s": window_s,
    }

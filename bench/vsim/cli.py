"""``python -m bench.vsim``: one workload, several routing profiles, one markdown table.

``--mode`` says how the gateway knows the engines (``bench/common/fleet_modes.py``;
``SimConfig.mode``): ``own`` (the default: heartbeats, KV events), ``third-party`` (listed
engines, scraped ``/metrics``, approximate index only) or ``both``: each profile in both modes
on the same workload and seed, a table per mode and one side by side with the ratios third-party
/ own (``bench/vsim/modes.py``). Third-party mode runs ``--third-party-profiles``, by default
``--profiles`` without the exact-index ones (each left out with a note).

``--replicas 1,2,8`` routes each profile through that many gateway replicas behind a
round-robin front (``bench/vsim/replicas.py``), each run on the same workload and seed, and adds
a table of each run's figures against the one-replica run's (``bench/vsim/replica_report.py``);
``--sharing on|off|both`` says whether the replicas share their approximate indexes through
``sy:approx`` (``bench/vsim/approx_share.py``), ``--peer-load on|off|both`` whether they share
their per-backend in-flight counts there too (``backends/fleet/peer_load.py``; on, as the gateway
does; off: each replica counts only its own).

Example::

    python -m bench.vsim --workers 8 --requests 20000 --workload shared-prefix \\
        --profiles round_robin,prefix_affinity --load 0.75 --seed 1 --json out.json
    python -m bench.vsim --mode both --profiles round_robin,prefix_affinity,prefix_affinity_approx
    python -m bench.vsim --workers 64 --replicas 1,8 --sharing both --profiles prefix_affinity
    python -m bench.vsim --workers 64 --replicas 1,8 --peer-load both --profiles prefix_affinity
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from backends.fleet.approx_sync import (
    FLUSH_INTERVAL_S,
    LAZY_INTERVAL_S,
    PUSH_INTERVAL_S,
    URGENT_PREFILL_TOKENS,
)
from backends.sim.profile import WorkerProfile
from bench.common.fleet_modes import MODE_CHOICES, Mode, key_of, parse_modes
from bench.run.workloads.base import TokenRange, WorkloadOptions
from bench.vsim.metrics import RunResult
from bench.vsim.modes import (
    comparison,
    comparison_table,
    fleet_view,
    third_party_profiles,
    verdict_table,
    verdicts,
)
from bench.vsim.profiles import LOAD_BLIND, MODEL, PROFILES, no_exact_index
from bench.vsim.replica_report import (
    peer_load_label,
    replica_rows,
    replica_table,
    replica_verdicts,
    sharing_label,
)
from bench.vsim.sim import SimConfig, Simulation
from bench.vsim.sizing import capacity_per_worker, kv_blocks_for
from bench.vsim.workloads import WORKLOAD_NAMES, Workload, build_workload


def _ms_or_off(text: str) -> float | None:
    return None if text == "off" else float(text)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.vsim",
        description="Route a workload through a simulated fleet in virtual time, per profile.")
    add = parser.add_argument
    add("--workers", type=int, default=8)
    add("--requests", type=int, default=20_000)
    add("--workload", choices=WORKLOAD_NAMES, default="shared-prefix")
    add("--profiles", default=",".join(PROFILES), help="comma-separated; " + ", ".join(PROFILES))
    add("--load", type=float, default=0.75,
        help="fraction of round-robin capacity (measured by simulation; see bench/vsim/sizing.py)")
    add("--rate", type=float, default=None, help="arrivals per second (overrides --load)")
    add("--seed", type=int, default=1)
    add("--json", type=Path, default=None, help="write the config and every result here")
    add("--groups", type=int, default=None, help="shared prefixes (default 6 per worker, >= 24)")
    add("--conversations", type=int, default=None,
        help="multi-turn conversations in progress (default 32 per worker)")
    add("--hot-share", type=float, default=0.3, help="hot-prefix: the hot group's traffic")
    add("--zipf-s", type=float, default=1.1, help="group popularity exponent (0: uniform)")
    add("--system-tokens", type=TokenRange.parse, default=TokenRange(1500, 3000))
    add("--question-tokens", type=TokenRange.parse, default=TokenRange(50, 200))
    add("--max-tokens", type=TokenRange.parse, default=TokenRange(64, 256))
    add("--turns", type=TokenRange.parse, default=TokenRange(2, 6))
    add("--kv-fraction", type=float, default=None,
        help="KV per worker as a fraction of the working set (default: 24,576 blocks, an H100)")
    add("--heartbeat-s", type=float, default=1.0, help="load figures refresh interval")
    add("--kv-flush-ms", type=float, default=50.0,
        help="a worker's KV events go out at its publisher's next flush, this often")
    add("--kv-delay-ms", type=float, default=1.0, help="KV event delivery delay after a flush")
    add("--poll-s", type=float, default=0.25,
        help="the gateway reads heartbeats this often (0: as they are sent)")
    add("--dispatch-ms", type=float, default=0.0,
        help="fixed latency per request of the live path (HTTP, parsing, tokenizing)")
    add("--max-age-s", type=float, default=5.0, help="load older than this is stale")
    add("--silent-workers", type=int, default=0, help="workers whose heartbeats stop at t=0")
    add("--warmup", type=float, default=0.1,
        help="fraction of requests (the first) simulated but left out of the figures")
    add("--mode", choices=MODE_CHOICES, default="own",
        help="own: heartbeats and KV events; third-party: listed engines, scraped /metrics; "
             "both: side by side")
    add("--third-party-profiles", default=None,
        help="third-party mode's profiles (default: --profiles without the exact-index ones)")
    add("--scrape-s", type=float, default=1.0,
        help="third-party: the gateway scrapes each engine's /metrics this often")
    add("--no-cache-feedback", action="store_true",
        help="the gateway ignores the cached tokens each response reports")
    add("--replicas", default="1",
        help="gateway replicas behind a round-robin front; a list (1,2,8) runs each")
    add("--sharing", choices=("on", "off", "both"), default="on",
        help="replicas share their approximate indexes through sy:approx (both: each way)")
    add("--peer-load", choices=("on", "off", "both"), default="on",
        help="replicas share their in-flight counts through sy:approx (both: each way)")
    add("--share-lessons", choices=("on", "off"), default="on",
        help="replicas that share claims also share what responses taught them about each "
             "backend's claim lifetime (off: each learns from its own responses only)")
    add("--share-scrapes", choices=("on", "off"), default="off",
        help="third-party: replicas share their /metrics scrapes (routing.share_scrapes; off: "
             "each replica scrapes every engine itself)")
    add("--share-flush-ms", type=float, default=FLUSH_INTERVAL_S * 1000,
        help="sy:approx batching interval and XREAD block (0: claims reach replicas at once)")
    add("--share-rtt-ms", type=float, default=1.0, help="sy:approx: a Redis round trip")
    add("--share-push-ms", type=_ms_or_off,
        default=None if PUSH_INTERVAL_S is None else PUSH_INTERVAL_S * 1000,
        help="sy:approx: a writer task flushes as the books change, at most once per this "
             "many ms (and a round trip, with --share-pipelined off; off: the read loop "
             "flushes, before each XREAD)")
    add("--share-lazy-ms", type=float, default=LAZY_INTERVAL_S * 1000,
        help="sy:approx: with the writer, a change that only lowers a replica's counts (a "
             "first token, a finish) waits up to this many ms for a dispatch (0: at once)")
    add("--share-urgent-prefill-tokens", type=int, default=URGENT_PREFILL_TOKENS,
        help="sy:approx: with the writer, a first token that takes at least this many prompt "
             "tokens of prefill off a backend's books (a cache miss's) goes at once, not after "
             "--share-lazy-ms (0: every first token)")
    add("--share-pipelined", choices=("on", "off"), default="on",
        help="sy:approx: with the writer, the next flush may go --share-push-ms after the last "
             "was sent, while its reply is on the way, as on a plain Redis connection (off: "
             "after the reply, as through redis-py: Sentinel, Cluster, TLS)")
    args = parser.parse_args(argv)
    try:
        args.replicas = [int(n) for n in args.replicas.split(",") if n]
    except ValueError:
        parser.error(f"--replicas takes counts like 1,2,8, not {args.replicas!r}")
    if not args.replicas or min(args.replicas) < 1:
        parser.error("--replicas needs counts of at least 1")
    args.profiles = [p for p in args.profiles.split(",") if p]
    unknown = [p for p in args.profiles if p not in PROFILES]
    if args.third_party_profiles is not None:
        args.third_party_profiles = [p for p in args.third_party_profiles.split(",") if p]
        unknown += [p for p in args.third_party_profiles if p not in PROFILES]
    if unknown:
        parser.error(f"unknown profile(s) {', '.join(unknown)}; use {', '.join(PROFILES)}")
    if args.third_party_profiles is not None:
        exact = [p for p in args.third_party_profiles if PROFILES[p][1] == "exact"]
        if exact:
            parser.error("; ".join(no_exact_index(p) for p in exact))
    return args


def mode_profiles(args: argparse.Namespace) -> dict[Mode, list[str]]:
    """Each mode's profiles; a note on stderr for each exact-index one third-party leaves out."""
    chosen: dict[Mode, list[str]] = {}
    for mode in parse_modes(args.mode):
        if mode == "own":
            chosen[mode] = list(args.profiles)
        elif args.third_party_profiles is not None:
            chosen[mode] = list(args.third_party_profiles)
        else:
            chosen[mode], skipped = third_party_profiles(args.profiles)
            for profile in skipped:
                print(f"third-party mode skips {no_exact_index(profile)}", file=sys.stderr)
    return chosen


def workload_factory(args: argparse.Namespace) -> Callable[[], Workload]:
    options = WorkloadOptions(system_tokens=args.system_tokens,
                              question_tokens=args.question_tokens, max_tokens=args.max_tokens,
                              zipf_s=args.zipf_s, turns=args.turns)
    num_groups = args.groups or max(24, 6 * args.workers)
    num_conversations = args.conversations or 32 * args.workers
    return lambda: build_workload(args.workload, options, num_groups=num_groups,
                                  num_conversations=num_conversations,
                                  hot_share=args.hot_share, seed=args.seed)


def run_label(result: RunResult) -> str:
    """The profile, with its replicas (``unshared`` when they share no index, ``no peer load``
    when they count only their own requests in flight)."""
    if result.num_replicas == 1:
        return result.profile
    unshared = "" if sharing_label(result) != "not shared" else " unshared"
    alone = "" if peer_load_label(result) != "off" else " no peer load"
    return f"{result.profile} x{result.num_replicas}{unshared}{alone}"


def variants(args: argparse.Namespace, profile: str) -> list[tuple[int, bool, bool]]:
    """(replicas, share the approximate index, share in-flight counts) for each run of
    ``profile``; one run where a choice cannot change a decision."""
    choices = {"on": [True], "off": [False], "both": [True, False]}
    routing_profile, index_mode = PROFILES[profile]
    return [(n, share, peer) for n in args.replicas
            for share in (choices[args.sharing] if n > 1 and index_mode != "none" else [True])
            for peer in (choices[args.peer_load]
                         if n > 1 and routing_profile not in LOAD_BLIND else [True])]


def format_table(results: Sequence[RunResult]) -> str:
    def ms(value: float) -> str:
        return "-" if math.isnan(value) else f"{value * 1000:,.0f}"

    lines = ["| profile | TTFT p50 / p90 / p99 (ms) | TPOT p50 / p90 (ms) | e2e p50 / p99 (s) "
             "| req/s | cached | ideal | share of ideal | spread req / busy / in flight | preempt "
             "| sim req/s |",
             "| --- | --- | --- | --- | ---: | ---: | ---: | ---: | --- | ---: | ---: |"]
    for r in results:
        lines.append(
            f"| {run_label(r)} | {ms(r.ttft_p50_s)} / {ms(r.ttft_p90_s)} / {ms(r.ttft_p99_s)} "
            f"| {ms(r.tpot_p50_s)} / {ms(r.tpot_p90_s)} | {r.e2e_p50_s:.2f} / {r.e2e_p99_s:.2f} "
            f"| {r.throughput_rps:,.1f} | {r.cached_fraction:.3f} | {r.ideal_cached_fraction:.3f} "
            f"| {r.share_of_ideal:.2f} | {r.requests_spread:.2f} / {r.busy_spread:.2f} / "
            f"{r.in_flight_spread:.2f} "
            f"| {r.num_preemptions} | {r.requests_per_wall_s:,.0f} |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    profiles = mode_profiles(args)
    if not any(profiles.values()):
        print("no profile to run", file=sys.stderr)
        return 2
    make_workload = workload_factory(args)
    probe = make_workload()
    worker = WorkerProfile(model=MODEL)
    if args.kv_fraction is not None:
        worker = replace(worker, num_kv_blocks=kv_blocks_for(args.kv_fraction, probe, worker))
    config = SimConfig(num_workers=args.workers, num_requests=args.requests, seed=args.seed,
                       worker=worker, heartbeat_s=args.heartbeat_s,
                       kv_event_delay_s=args.kv_delay_ms / 1000,
                       kv_flush_s=args.kv_flush_ms / 1000, poll_interval_s=args.poll_s,
                       dispatch_s=args.dispatch_ms / 1000, max_age_s=args.max_age_s,
                       num_silent_workers=args.silent_workers, warmup_fraction=args.warmup,
                       scrape_interval_s=args.scrape_s, cache_feedback=not args.no_cache_feedback,
                       share_flush_s=args.share_flush_ms / 1000,
                       share_rtt_s=args.share_rtt_ms / 1000,
                       share_lessons=args.share_lessons == "on",
                       share_scrapes=args.share_scrapes == "on",
                       share_push_s=(None if args.share_push_ms is None
                                     else args.share_push_ms / 1000),
                       share_lazy_s=args.share_lazy_ms / 1000,
                       share_urgent_prefill_tokens=args.share_urgent_prefill_tokens,
                       share_pipelined=args.share_pipelined == "on")
    capacity = math.nan
    rate = args.rate
    if rate is None:
        started_s = time.perf_counter()
        capacity = capacity_per_worker(config, make_workload)
        rate = args.load * args.workers * capacity
        print(f"capacity with round-robin: {capacity:.2f} req/s per worker (measured in "
              f"{time.perf_counter() - started_s:.1f} s); rate = {args.load:g} x "
              f"{args.workers} x {capacity:.2f} = {rate:.1f} req/s", file=sys.stderr)
    print(f"{args.workload}: {args.workers} workers, {args.requests:,} requests at "
          f"{rate:,.1f} req/s, working set {probe.working_set_tokens:,} tokens, KV "
          f"{worker.kv_capacity_tokens:,} tokens per worker "
          f"({worker.kv_capacity_tokens / probe.working_set_tokens:.0%} of the working set)\n")
    results: dict[Mode, list[RunResult]] = {}
    fleets: dict[str, dict[str, Any]] = {}
    for mode, names in profiles.items():
        for profile, (num_replicas, share, peer) in [(p, v) for p in names
                                                      for v in variants(args, p)]:
            simulation = Simulation(replace(config, profile=profile, rate_per_s=rate, mode=mode,
                                            num_replicas=num_replicas, share_approx=share,
                                            peer_load=peer),
                                    make_workload())
            result = simulation.run()
            print(f"{run_label(result)} ({mode}): {result.wall_s:.1f} s wall, "
                  f"{result.requests_per_wall_s:,.0f} requests per wall-second", file=sys.stderr)
            results.setdefault(mode, []).append(result)
            fleets.setdefault(key_of(mode), {})[run_label(result)] = fleet_view(
                simulation.backends)
    first_replicas = args.replicas[0]
    rows = comparison({mode: [r for r in mode_results if r.num_replicas == first_replicas
                              and sharing_label(r) != "not shared"
                              and peer_load_label(r) != "off"]
                       for mode, mode_results in results.items()})
    found = verdicts(rows)
    all_results = [r for mode_results in results.values() for r in mode_results]
    replicas = replica_rows(all_results)
    replica_found = replica_verdicts(replicas)
    if len(results) == 1:
        print(format_table(next(iter(results.values()))))
    else:
        for mode, mode_results in results.items():
            print(f"**{mode}**\n\n{format_table(mode_results)}\n")
        print("**Own / third-party, side by side** (cells: own / third-party (ratio "
              "third-party / own))\n")
        print(comparison_table(rows) + "\n")
        print(verdict_table(found))
    if replicas:
        print("\n**N replicas / one** (cells: 1 replica / N replicas (ratio N / 1))\n")
        print(replica_table(replicas) + "\n")
        print(verdict_table(replica_found))
    if args.json is not None:
        document: dict[str, Any] = {
            "argv": list(argv if argv is not None else sys.argv[1:]),
            "rate_per_s": rate, "capacity_per_worker_rps": capacity,
            "working_set_tokens": probe.working_set_tokens,
            "kv_tokens_per_worker": worker.kv_capacity_tokens,
            "modes": list(results),
            "results": [r.to_dict() for mode_results in results.values() for r in mode_results],
            "fleet": fleets, "comparison": rows, "targets": found,
            "replicas": replicas, "replica_targets": replica_found}
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(document, indent=2, allow_nan=True) + "\n")
    return 0

"""Live: routing profiles compared on fresh simulated fleets, in one run, on an own
fleet and on a third-party one.

For each profile (round_robin, least_load, random, prefix_affinity with the approximate index,
prefix_affinity with the exact index) a fresh fleet is started (redis, ``--workers`` simulated
workers, a gateway with that profile and SLO admission off) and driven open-loop (Poisson) with
ANCHORS.md's shared-prefix workload (24 tenants, one 1.5-3k-token system prompt each, Zipf
popularity, unique 50-200-token questions, streaming) at ~75% of round-robin's capacity. Each
worker's KV cache is a set share of the 24 system prompts' working set (``--kv-fraction``,
default KV_FRACTION): cache pressure like ANCHORS.md's, where round-robin misses on about a
third of the prompt tokens. ``--kv-fraction default`` gives the sim's 24,576 blocks, where
every worker holds every prompt: no cache pressure. Then: the multi-turn workload (round_robin
vs both prefix_affinity variants; also the share of turns kept on the previous turn's worker);
the hot-prefix experiment (one group carries 30% of the traffic at a rate where its single
holder would saturate, against a uniform workload at the same rate); and KV pressure (each
worker's KV = 25% and 100% of the working set), exact vs approximate index, round_robin as a
reference (`bench.routing.experiments`).

**Modes** (``--mode``, `bench.common.fleet_modes`; default ``both``). *own*: the workers join the
gateway by heartbeat and publish KV events (the exact index exists). *third-party*: the same
engines without Redis, listed in the gateway's ``backends:`` with worker discovery off, no
tokenizer and no stated profile, so the gateway knows only what it scrapes (``/metrics``,
``/v1/models``) and its own books; profiles ``--third-party-profiles`` (default round_robin and
prefix_affinity (approx): there is no exact index). Each profile's runs in the two modes go
back to back, at the same rate; the report sets them side by side with the ratio third-party /
own of TTFT p90, p99 and cached share (target: within 10 %; `bench.routing.compare`).

**Calibration.** At the same worker KV, round-robin's capacity C is the throughput of a
closed loop with 16 requests in flight per worker (``--calibration-concurrency``): requests
finished within its ``--calibration-s``, per second; every engine is busy ~100% of the time
there (reported). It runs once, on the own fleet (the third-party one with ``--mode
third-party``), and both modes use its rates. The main rate is 0.75 C. The hot-prefix rate
makes the hot group alone offer 1.2x one worker's share of C, within [0.75 C, C]:
``1.2 C / (workers * 0.3)`` = C for 4 workers. With ``--rate R`` there is no calibration and
C = R / 0.75. Figures: `bench.routing.figures`. Run it under the shared lock::

    flock /tmp/switchyard-bench.lock .venv/bin/python -m bench.routing   # ~35 minutes
    flock /tmp/switchyard-bench.lock .venv/bin/python -m bench.routing --mode own
    .venv/bin/python -m bench.routing --quick --profiles round_robin,prefix_affinity:exact
    .venv/bin/python -m bench.routing --rate 30 --experiments shared-prefix,hot-prefix
    .venv/bin/python -m bench.routing --kv-fraction default --experiments shared-prefix

The JSON goes to ``--out`` (default ``bench/results/routing-live-TIME.json``): the calibration
and rates, then each mode's runs under ``own`` and ``third_party``, the comparison and the
targets; the tables (``bench.routing.compare``) are printed.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import resource
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from bench.common.fleet_modes import MODE_CHOICES, Mode, key_of, parse_modes
from bench.common.procstat import busy_cpu_seconds, cpu_seconds
from bench.routing.compare import all_verdicts, comparison, document_markdown
from bench.routing.drive import Load, drive, make_tenants
from bench.routing.experiments import run_experiments
from bench.routing.figures import ideal_per_request, run_figures
from bench.routing.fleet import FleetSpec, routing_fleet
from bench.routing.workloads import (
    hot_weights,
    uniform_weights,
    weighted_prefix,
    working_set_blocks,
)
from bench.run.spec import RequestSpec, TenantSpec
from bench.run.workloads import WORKLOADS, WorkloadOptions

PROFILES = {"round_robin": FleetSpec("round_robin"), "least_load": FleetSpec("least_load"),
            "random": FleetSpec("random"),
            "prefix_affinity:approx": FleetSpec("prefix_affinity", "approx"),
            "prefix_affinity:exact": FleetSpec("prefix_affinity", "exact"),
            "prefix_affinity_no_room:approx": FleetSpec("prefix_affinity_no_room", "approx"),
            "prefix_affinity_no_room:exact": FleetSpec("prefix_affinity_no_room", "exact")}
EXPERIMENTS = ("shared-prefix", "multi-turn", "hot-prefix", "kv-pressure")
# Third-party mode: the approximate index (no KV events, no exact one), round_robin as reference.
THIRD_PARTY_PROFILES = ("round_robin", "prefix_affinity:approx")
HOT_SHARE = 0.3
HOT_SATURATION = 1.2  # the hot group's rate over one worker's share of the capacity
KV_FRACTIONS = (0.25, 1.0)
# Worker KV of the main experiments, as a share of the system prompts' working set, chosen by
# a sweep (0.35 / 0.5 / 0.7): at 0.5 round_robin keeps 0.69 of the prompt tokens cached in
# steady state (ANCHORS.md's round-robin: 0.69) while the 4 workers together hold the working
# set twice (docs/benchmarks.md, "Routing, live").
KV_FRACTION = 0.5
MIN_KV_BLOCKS = 256  # the longest request (~3.4k tokens, 213 blocks) must fit whole


@dataclass(frozen=True, slots=True)
class Settings:
    """Everything one benchmark run is parameterised by."""

    num_workers: int = 4
    num_groups: int = 24
    num_conversations: int = 64
    send_s: float = 50.0
    # Requests sent in the first warmup_s fill the caches and are left out of the figures
    # (`run_figures`): the comparison is of steady states, not of 24 cold misses at the start.
    warmup_s: float = 10.0
    drain_s: float = 20.0
    calibration_s: float = 20.0
    calibration_concurrency: int = 16  # per worker
    seed: int = 1
    speed_factor: float | None = None
    # Worker KV of the calibration and the shared-prefix, multi-turn and hot-prefix runs:
    # ``num_kv_blocks`` if set, else ``kv_fraction`` of the working set, else (both None) the
    # sim's default. kv-pressure sets its own.
    kv_fraction: float | None = KV_FRACTION
    num_kv_blocks: int | None = None
    workdir: Path = Path("bench/results/routing-live-fleet")


def _specs(workload: str, settings: Settings, tenants: Sequence[TenantSpec]
           ) -> Iterator[RequestSpec]:
    options = WorkloadOptions(num_groups=settings.num_groups,
                              num_conversations=settings.num_conversations)
    if workload == "hot":
        return weighted_prefix(options, tenants, settings.seed,
                               hot_weights(settings.num_groups, HOT_SHARE))
    if workload == "uniform":
        return weighted_prefix(options, tenants, settings.seed,
                               uniform_weights(settings.num_groups))
    return WORKLOADS[workload](options, tenants, settings.seed)


def kv_blocks_for(fraction: float, working_set_blocks: int) -> int:
    """Worker KV blocks holding ``fraction`` of the working set (never under MIN_KV_BLOCKS)."""
    return max(MIN_KV_BLOCKS, math.ceil(fraction * working_set_blocks))


def main_kv_blocks(settings: Settings, working_set_blocks: int) -> int | None:
    """The worker KV of the main experiments (`Settings`); None: the sim's default."""
    if settings.num_kv_blocks is not None:
        return settings.num_kv_blocks
    if settings.kv_fraction is None:
        return None
    return kv_blocks_for(settings.kv_fraction, working_set_blocks)


def run_one(spec: FleetSpec, workload: str, load: Load, settings: Settings) -> dict[str, Any]:
    """One fresh fleet, one workload, one load: its figures."""
    spec = replace(spec, num_workers=settings.num_workers, speed_factor=settings.speed_factor)
    started, busy_before, own_before = time.monotonic(), busy_cpu_seconds(), _own_cpu_s()
    slug = re.sub(r"\W+", "-", f"{workload}-{spec.mode}-{spec.label}-{spec.num_kv_blocks or 'kv'}-"
                  f"{'closed' if load.concurrency else f'{load.rate_per_s:.1f}'}").strip("-")
    with routing_fleet(spec, settings.workdir / slug) as fleet:
        tenants = make_tenants(fleet, settings.num_groups)
        result = drive(fleet, _specs(workload, settings, tenants), load)
        names = sorted(fleet.worker_urls)
        fleet_cpu_s = sum(cpu_seconds(pid) for pid in fleet.pids.values())
        known_by = {k: v for k, v in fleet.backends.items() if k != "backends"}
    others_cpu_s = busy_cpu_seconds() - busy_before - fleet_cpu_s - (_own_cpu_s() - own_before)
    figures = run_figures(result.records, result.messages, result.counters, result.window_s,
                          names, result.routed, speed_factor=settings.speed_factor or 1.0,
                          warmup_s=settings.warmup_s if load.rate_per_s else 0.0)
    # Every request's record and ideal hit, for per-request analysis (which missed, where).
    ideal = ideal_per_request(result.records, result.messages)
    (settings.workdir / slug / "records.json").write_text(json.dumps(
        [{**r.to_json(), "ideal_cached_tokens": ideal.get(r.index)} for r in result.records]))
    elapsed_s = time.monotonic() - started
    num_done_in_send = sum(r.is_ok and r.sent_at_s + (r.e2e_s or 0.0) <= load.send_s
                           for r in result.records)
    print(f"  {spec.mode:11} {spec.label:24} {workload:13} ok {figures['num_ok']:5} "
          f"ttft p50/p99 {figures['ttft_ms']['p50'] or math.nan:7.0f}/"
          f"{figures['ttft_ms']['p99'] or math.nan:6.0f} ms  cached "
          f"{figures['cached_fraction'] or math.nan:.3f}  ({elapsed_s:.0f} s)", file=sys.stderr)
    return {"label": spec.label, "mode": spec.mode, "fleet": known_by,
            "workload": workload, "rate_per_s": load.rate_per_s,
            "concurrency": load.concurrency, "send_s": load.send_s,
            "num_kv_blocks": spec.num_kv_blocks, "num_done_in_send": num_done_in_send,
            "fleet_cores": fleet_cpu_s / elapsed_s, "others_cores": others_cpu_s / elapsed_s,
            **figures}


def _own_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def calibrate(settings: Settings, num_kv_blocks: int | None, mode: Mode = "own"
              ) -> dict[str, Any]:
    """Round-robin's capacity: closed-loop throughput with every engine kept busy."""
    concurrency = settings.calibration_concurrency * settings.num_workers
    load = Load(concurrency=concurrency, send_s=settings.calibration_s,
                drain_s=settings.drain_s, seed=settings.seed)
    figures = run_one(replace(PROFILES["round_robin"], num_kv_blocks=num_kv_blocks, mode=mode),
                      "shared-prefix", load, settings)
    capacity = figures["num_done_in_send"] / settings.calibration_s
    return {**figures, "capacity_rps": capacity, "rate_75_rps": 0.75 * capacity,
            "hot_rate_rps": hot_rate(capacity, settings.num_workers)}


def hot_rate(capacity_rps: float, num_workers: int) -> float:
    """The hot-prefix rate: the hot group alone offers `HOT_SATURATION` x one worker's share of
    the capacity, within [0.75, 1] x the capacity (with under 4 workers a 30% group cannot
    outgrow one worker below the whole fleet's capacity)."""
    wanted = HOT_SATURATION * capacity_rps / (num_workers * HOT_SHARE)
    return min(capacity_rps, max(0.75 * capacity_rps, wanted))


def run_all(settings: Settings, profiles: Mapping[Mode, Sequence[str]],
            experiments: Sequence[str], rate_per_s: float | None) -> dict[str, Any]:
    """Every experiment asked for in every mode of ``profiles`` (mode -> its profiles); the
    results as one JSON-ready dict: the shared calibration and rates, then each mode's runs
    under its `key_of` (``own``, ``third_party``)."""
    modes = list(profiles)
    out: dict[str, Any] = {"modes": modes}
    working_set = working_set_blocks(WorkloadOptions(num_groups=settings.num_groups),
                                     settings.num_groups, settings.seed)
    kv_blocks = main_kv_blocks(settings, working_set)
    out["kv"] = {"working_set_blocks": working_set, "num_kv_blocks": kv_blocks,
                 "fraction": kv_blocks / working_set if kv_blocks else None}
    if rate_per_s is None:
        # One calibration for both modes (own if it runs): they are compared at one rate.
        print(f"calibrating round_robin's capacity ({modes[0]}) ...", file=sys.stderr)
        out["calibration"] = calibrate(settings, kv_blocks, modes[0])
        rate_per_s = float(out["calibration"]["rate_75_rps"])
    capacity = rate_per_s / 0.75
    hot_rps = hot_rate(capacity, settings.num_workers)
    load = Load(rate_per_s=rate_per_s, send_s=settings.send_s, drain_s=settings.drain_s,
                seed=settings.seed)
    specs = {mode: {p: replace(PROFILES[p], num_kv_blocks=kv_blocks, mode=mode) for p in names}
             for mode, names in profiles.items()}
    pressure = {f"{fraction:.0%}": kv_blocks_for(fraction, working_set)
                for fraction in KV_FRACTIONS}
    by_mode = run_experiments(lambda spec, workload, run_load: run_one(
        spec, workload, run_load, settings), specs, experiments, load,
        replace(load, rate_per_s=hot_rps), pressure)
    for mode, runs in by_mode.items():
        if "kv_pressure" in runs:
            runs["kv_pressure"]["working_set_blocks"] = working_set
        out[key_of(mode)] = runs
    out["rates"] = {"main_rps": rate_per_s, "hot_rps": hot_rps, "capacity_rps": capacity,
                    # the hot group's rate over one worker's share of the capacity
                    "hot_group_per_worker_capacity": HOT_SHARE * hot_rps
                    / (capacity / settings.num_workers)}
    return out


def _every_run(results: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every run's figures in ``results`` (calibration, each mode's experiments and points)."""
    if "calibration" in results:
        yield results["calibration"]
    for mode in results["modes"]:
        runs = results[key_of(mode)]
        for key in ("shared_prefix", "multi_turn"):
            yield from runs.get(key, {}).values()
        for pair in runs.get("hot_prefix", {}).values():
            yield from pair.values()
        for point in runs.get("kv_pressure", {}).get("points", {}).values():
            yield from point.values()


def build_parser() -> argparse.ArgumentParser:
    """The options of ``python -m bench.routing``."""
    parser = argparse.ArgumentParser(prog="python -m bench.routing", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--mode", choices=MODE_CHOICES, default="both",
                        help="own: workers joining by heartbeat; third-party: the same engines "
                        "without Redis, listed in backends:; both (default): side by side")
    parser.add_argument("--profiles", default=",".join(PROFILES),
                        help=f"own mode, comma-separated, from {', '.join(PROFILES)}")
    parser.add_argument("--third-party-profiles", default=",".join(THIRD_PARTY_PROFILES),
                        help="third-party mode, comma-separated (no exact index: "
                        f"{', '.join(p for p in PROFILES if PROFILES[p].index == 'approx')})")
    parser.add_argument("--experiments", default=",".join(EXPERIMENTS),
                        help=f"comma-separated, from {', '.join(EXPERIMENTS)}")
    parser.add_argument("--duration", type=float, default=50.0,
                        help="seconds of sending a run, warm-up included")
    parser.add_argument("--warmup", type=float, default=10.0,
                        help="seconds at the start of an open-loop run left out of the figures")
    parser.add_argument("--calibration-s", type=float, default=20.0)
    parser.add_argument("--calibration-concurrency", type=int, default=16, help="per worker")
    parser.add_argument("--rate", type=float, help="req/s: skip the calibration, use this")
    parser.add_argument("--speed-factor", type=float, help="the sim's GPU speed (default 1)")
    parser.add_argument("--seed", type=int, default=1)
    kv = parser.add_mutually_exclusive_group()
    kv.add_argument("--kv-fraction", type=_kv_fraction, default=KV_FRACTION,
                    help="each worker's KV as a share of the system prompts' working set, for "
                    f"all but kv-pressure (default {KV_FRACTION}); 'default': the sim's 24,576 "
                    "blocks (no cache pressure)")
    kv.add_argument("--kv-blocks", type=int, help="each worker's KV in 16-token blocks")
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: 2 workers, 6 groups, 2 s per run (each mode)")
    parser.add_argument("--out", type=Path, help="JSON path (default bench/results/...)")
    return parser


def chosen_profiles(mode: str, own: str, third_party: str) -> dict[Mode, list[str]] | str:
    """Each mode's profiles from the options; a string says what is wrong."""
    asked = {"own": own, "third-party": third_party}
    profiles: dict[Mode, list[str]] = {m: [p for p in asked[m].split(",") if p]
                                       for m in parse_modes(mode)}
    for m, names in profiles.items():
        unknown = [p for p in names if p not in PROFILES]
        if unknown or not names:
            return f"unknown {m} profile: {', '.join(unknown) or '(none given)'}"
        exact = [p for p in names if m == "third-party" and PROFILES[p].index == "exact"]
        if exact:
            return (f"{', '.join(exact)}: a third-party fleet sends no KV events, so there is "
                    "no exact index; use the :approx variant")
    return profiles


def _kv_fraction(text: str) -> float | None:
    if text == "default":
        return None
    fraction = float(text)
    if not fraction > 0:
        raise argparse.ArgumentTypeError("a KV fraction is > 0, or 'default'")
    return fraction


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark, write its JSON and print its tables."""
    args = build_parser().parse_args(argv)
    profiles = chosen_profiles(args.mode, args.profiles, args.third_party_profiles)
    experiments = [e for e in args.experiments.split(",") if e]
    unknown = [e for e in experiments if e not in EXPERIMENTS]
    if isinstance(profiles, str) or unknown:
        print(profiles if isinstance(profiles, str) else
              f"unknown experiment: {', '.join(unknown)}", file=sys.stderr)
        return 2
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out_path: Path = args.out or Path("bench/results") / f"routing-live-{stamp}.json"
    settings = Settings(num_workers=args.workers, send_s=args.duration, warmup_s=args.warmup,
                        calibration_s=args.calibration_s,
                        calibration_concurrency=args.calibration_concurrency, seed=args.seed,
                        speed_factor=args.speed_factor, kv_fraction=args.kv_fraction,
                        num_kv_blocks=args.kv_blocks,
                        workdir=out_path.with_suffix("").with_name(out_path.stem + "-fleet"))
    if args.quick:
        settings = replace(settings, num_workers=2, num_groups=6, num_conversations=8,
                           send_s=2.0, warmup_s=0.0, drain_s=5.0, calibration_s=2.0)
    started = time.monotonic()
    busy_before = busy_cpu_seconds()
    results = run_all(settings, profiles, experiments, args.rate)
    elapsed_s = time.monotonic() - started
    others = [run["others_cores"] for run in _every_run(results)]
    results["config"] = {
        "command": " ".join(["python -m bench.routing", *(argv or sys.argv[1:])]),
        "date": time.strftime("%Y-%m-%d %H:%M:%S"), "profiles": profiles,
        "modes": list(profiles),
        "experiments": experiments, "elapsed_s": elapsed_s,
        "machine_busy_cores": (busy_cpu_seconds() - busy_before) / elapsed_s,
        "settings": {k: str(v) for k, v in vars(args).items()},
        "num_workers": settings.num_workers, "num_groups": settings.num_groups,
        "num_conversations": settings.num_conversations, "send_s": settings.send_s,
        "warmup_s": settings.warmup_s,
        "others_cores": {"min": min(others, default=None), "max": max(others, default=None),
                         "mean": sum(others) / len(others) if others else None},
    }
    results["comparison"] = comparison(results)
    results["targets"] = all_verdicts(results)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(results, indent=1, default=str))
    print(document_markdown(results))
    print(f"results in {out_path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
